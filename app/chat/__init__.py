"""The chat window's parts: conversation view, messages, Markdown, composer, sidebar, settings.

Pure logic (``settings``, ``markdown``, ``export``, ``session``) is kept apart from widgets so it
can be tested without a window.
"""

