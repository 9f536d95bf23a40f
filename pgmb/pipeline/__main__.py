"""``python -m pgmb.pipeline JOB …`` and ``spark-submit pgmb/pipeline/__main__.py JOB …``."""

# Absolute import: spark-submit runs this file as a script, outside its package.
from pgmb.pipeline.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
