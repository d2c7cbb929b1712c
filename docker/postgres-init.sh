#!/bin/sh
# Run once by the postgres image at its first start (docker/compose.yaml): the capture role and
# the demo tables (docker/postgres-shop.psql), the role's password from CDC_PASSWORD.
set -e
psql -v ON_ERROR_STOP=1 -v cdc_password="$CDC_PASSWORD" --username "$POSTGRES_USER" \
  --dbname "$POSTGRES_DB" -f /docker-entrypoint-initdb.d/postgres-shop.psql
