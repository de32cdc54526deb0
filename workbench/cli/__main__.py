"""`python -m workbench.cli` = `wb`."""

from workbench.cli import main

main()
