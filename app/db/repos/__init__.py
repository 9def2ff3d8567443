"""Repositories: all SQL of the application, one module per aggregate."""
