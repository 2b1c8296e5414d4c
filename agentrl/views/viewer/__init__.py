"""``agentrl inspect``'s HTML viewer: ``page.py`` builds one self-contained page from a run; the
template, stylesheet and script next to it are embedded into that page."""
