"""``hookline console``: a team's window on its own events, over HTTP.

One process serves the JSON API under ``/api/v1`` (``api.py``, described by ``openapi.json``),
the server-rendered pages (``pages.py``), and the ops routes. Every request is authorised first
(``access.py``: who is asking, and which providers they may read and replay), then reads through
``store.py``, whose transactions run as a role that row-level security limits to those providers.
"""
