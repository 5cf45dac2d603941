"""The pipeline stages: ``mmw <command>`` runs ``mmw.stages.<module>.run`` (see dvc.yaml and mmw/cli.py)."""
