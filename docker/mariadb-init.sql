-- Run once by the mariadb image at its first start (docker/compose.yaml), in database `shop`.
-- The image made user `cdc` (MARIADB_USER, MARIADB_PASSWORD) with every privilege on `shop`;
-- here it gets the global privileges capture needs (connectors/mysql/requirements.py:
-- PRIVILEGES).
GRANT REPLICATION SLAVE, REPLICATION CLIENT ON *.* TO 'cdc'@'%';
CREATE TABLE shop.products (id BIGINT PRIMARY KEY, name VARCHAR(100) NOT NULL,
                            price DECIMAL(12, 2), stock INT);
INSERT INTO shop.products VALUES (1, 'kettle', 24.90, 12), (2, 'teapot', 31.00, 4),
                                 (3, 'mug', 6.50, 120);
