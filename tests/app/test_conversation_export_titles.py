"""Issue 35, defect 11 (the conversation side): exports carry the attachments and a clean file
name from the current title, an automatic title follows an edit of the first message (a
chosen one stays), and search snippets drop markup and clip at words."""
from __future__ import annotations

import json

from app.chat.conversations import Conversations, make_title, snippet
from app.db import ChatStore
from app.db import Attachment


def _convs(tmp_path) -> Conversations:
    return Conversations(ChatStore(tmp_path / "chat.db"))


def test_exports_carry_attachments_and_a_clean_name(tmp_path):
    c = _convs(tmp_path)
    conv = c.create()
    c.add_user_message(conv, "What does os.path.join do?",
                       attachments=(Attachment(name="notes.md", kind="text",
                                               content="line one\nline two"),))
    c.title_from(conv, "What does os.path.join do?")
    md = c.export_text(conv, "md")
    assert "**Attachment: notes.md**" in md and "line two" in md
    doc = json.loads(c.export_text(conv, "json"))
    files = [a for m in doc["messages"] for a in m.get("attachments", [])]
    assert files and files[0]["name"] == "notes.md" and "line one" in files[0]["content"]
    name = c.export_name(conv, "md")
    assert name.endswith(".md") and "_" not in name and name.startswith("What does os")


def test_an_automatic_title_follows_an_edit_of_the_first_message(tmp_path):
    c = _convs(tmp_path)
    conv = c.create()
    first = c.add_user_message(conv, "old question")
    c.title_from(conv, "old question")
    old = c.new_version_of(conv, first)
    c.add_user_message(conv, "new question", parent_id=old.parent_id)
    c.retitle_after_edit(conv, old, "new question")
    assert c.title(conv) == make_title("new question")
    c.rename(conv, "My own title")
    old = c.message(first)
    c.retitle_after_edit(conv, old, "third question")
    assert c.title(conv) == "My own title"


def test_snippets_drop_markup_and_clip_at_words():
    text = ("Use ``os.path.join(a, *p)`` :: Join one or more path segments intelligently. "
            "The return value is the concatenation of path and any members of *p* with "
            "exactly one directory separator following each non-empty part.")
    s = snippet(text, "concatenation")
    assert "``" not in s and "::" not in s and "*" not in s
    assert s.startswith("…") and s.endswith("…")
    words = text.replace("*", "").split()
    assert all(w in words or w.strip("…") in words for w in s.split())
