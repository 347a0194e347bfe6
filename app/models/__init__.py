"""The model manager: ``window`` (catalog, check, downloads, installed models), ``catalog``,
``panels`` (download rows, report formatting), ``jobs`` (download and pre-check threads)."""
