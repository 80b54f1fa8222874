# Loads synced_plugin (its import hook) in every Python process started with TM_SYNCED=1 and this folder on
# PYTHONPATH: the pytest process and the DDP pool workers torchmetrics' tests spawn alike. Nothing otherwise.
import os

if os.environ.get("TM_SYNCED", "0") == "1":
    import synced_plugin  # noqa: F401
