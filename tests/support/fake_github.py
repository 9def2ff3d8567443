"""Serve a ``FakeGitHub`` (``app/extensions/github/fake.py``) on a free loopback port.

```python
with serve_fake_github(tmp_path / "widgets.git") as fake:   # uvicorn in a thread
    pull = fake.open_pull({"src/a.py": "print(1)\\n"}, title="Fix a")
    client_url = fake.base_url                                # http://127.0.0.1:<port>
```
"""

from __future__ import annotations

from app.extensions.github.fake_serve import serve_in_thread as serve_fake_github

__all__ = ["serve_fake_github"]
