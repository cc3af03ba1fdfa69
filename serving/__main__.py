"""``python -m serving`` runs ehr-serve (the console script may not be installed)."""
import sys

from serving.cli import main

sys.exit(main())
