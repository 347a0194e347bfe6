"""The chat window (``main_window``) and its parts: conversation view, messages, Markdown,
composer, sidebar, settings, model picker, the other windows (``aux_windows``).

Logic is kept apart from widgets so it can be tested without a window: ``conversations``
(every conversation operation, no Qt), ``session`` (streaming replies), ``stats_line``,
``settings``, ``markdown``, ``export``.
"""
