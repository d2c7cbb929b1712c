"""PySpark jobs: the Spark data source over the change log, the fold (latest per key by position)
and one streaming query per follower (``jobs.py``), riding out outages (``outages.py``).
"""
