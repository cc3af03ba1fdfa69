"""`python -m ehr_pipeline.cli`: the same command line as `ehr-pipeline`."""
import sys

from ehr_pipeline.cli.main import main

sys.exit(main())
