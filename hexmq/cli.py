"""`python -m hexmq.cli ...` runs the `hexmq` command (hexmq_cli), as it did when the command
lived here.

Every local cluster's processes are started this way (cluster.json records `python -P -m
hexmq.cli SERVICE ...`), by this release and by the ones before it: a node restarted or rolled
back with `hexmq cluster start N --python` another release's interpreter runs the same command
line, and a cluster.json written by an older release starts with this one's. Importing this
module does nothing: the shared package never imports the command's package.
"""

import runpy

if __name__ == "__main__":
    runpy.run_module("hexmq_cli", run_name="__main__", alter_sys=True)
