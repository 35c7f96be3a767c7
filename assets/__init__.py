"""Files the packaged configs use: ``quickstart-base/``, the quickstart's base policy
(rebuilt by ``scripts/build_quickstart_base.py``)."""
