"""`python -m streamdi.run.cli`: the same as the `streamdi` console script."""

from streamdi.run.cli import main

main()
