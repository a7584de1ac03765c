"""`trainsup web` in a real browser: Debian's chromium, driven by selenium, over a live demo run under
`trainsup run`; the pages' DOM, live updates, token and actions checked as a user meets them."""
