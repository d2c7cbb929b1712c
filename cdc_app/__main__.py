"""``python -m cdc_app``: the ``cdc`` command line."""

from cdc_app.cli import main

main()
