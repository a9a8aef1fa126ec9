"""`python -m spark.hexmq_traces INPUT... --out DIR`: see job.py."""

import sys

from spark.hexmq_traces.job import main

sys.exit(main())
