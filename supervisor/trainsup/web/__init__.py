"""The page: ``trainsup web`` (and ``trainsup serve --web``) shows the runs trainsup knows in a browser.

Owns the views (runs list, one run, the queue), the actions behind the token (stop, queue edits),
reading run dirs for them (incrementally, never from a supervisor's output path) and serving it all.
It sits above ``commands`` and uses their code for what the command line does the same way
(``status``'s view of a run, ``stop``, ``queue``); no supervisor imports it.

- ``server``: the address, the token line, waitress;
- ``app``: the routes;
- ``auth``: the token, cookie, CSRF and Host checks;
- ``runs``: which runs, and each one's row and detail;
- ``journals``: incremental reading of ``events.jsonl`` and ``progress.jsonl``;
- ``plots``: downsampling and the SVG curves;
- ``files``: which files may be served, the log tail, the sample images.
"""
