import sys

from sparkdeploy.cli import main

sys.exit(main())
