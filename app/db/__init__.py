"""Database layer: engines per dialect, tables, repositories, migrations helpers."""
