"""FastAPI routers, request/response schemas, and the error -> HTTP mapping."""
