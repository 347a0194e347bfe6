"""`generate --chat` hides an empty leading think block and nothing else."""
import pytest

from engine.commands.generate import EmptyThinkFilter


def _run(chunks):
    f = EmptyThinkFilter()
    return "".join(f.feed(c) for c in chunks) + f.flush()


@pytest.mark.parametrize("chunks,expected", [
    (["<think>\n\n</think>\n\n", "Answer."], "Answer."),
    (["<th", "ink>", "\n", "\n</th", "ink>\n", "\nAns", "wer."], "Answer."),
    (["<think>\nplan\n</think>\n\nAnswer."], "<think>\nplan\n</think>\n\nAnswer."),
    (["<think>", "\npl", "an</think>Answer"], "<think>\nplan</think>Answer"),
    (["Plain answer ", "<think></think>"], "Plain answer <think></think>"),
    (["<thin", "g>"], "<thing>"),
    (["<think>\n\n</think>\n\n"], ""),
    (["<think>\n"], "<think>\n"),  # cut off while thinking: shown as it is
    ([], ""),
])
def test_empty_think_filter(chunks, expected):
    assert _run(chunks) == expected
