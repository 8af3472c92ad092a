#!/usr/bin/env python3
"""Write every generated file of the repository from its source, or check them.

    .venv/bin/python scripts/generate.py          # (re)write what is stale
    .venv/bin/python scripts/generate.py --check  # write nothing; exit 1, naming each stale file

The generators live in scripts/generators/ (outputs.py lists every file they make):
the Grafana dashboards and alert rules in charts/kvpilot/files/, docs/crd-reference.md,
docs/benchmarks.md (from the benchmarks' records in benchmarks/results/), and the chart's CRD
copy and RBAC rules. tests/test_generate.py runs the check.
"""

import sys

# Run as a script, this file's folder is first on sys.path, so the package next to it imports
# as `generators` (the tests import it as `scripts.generators`; its modules import relatively).
from generators.outputs import main

if __name__ == "__main__":
    sys.exit(main())
