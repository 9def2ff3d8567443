"""Pipeline controllers, one module per topic; ``pipeline.py`` wires them."""
