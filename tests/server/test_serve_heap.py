"""``engine serve`` moves its loaded heap out of the cyclic GC's reach, as the app does: a full
collection over it would stall every stream it lands in."""
import gc

from engine.commands.serve import loaded_and_frozen


def _tracked(obj) -> bool:
    """Whether a collection would scan ``obj`` (frozen objects are in no generation)."""
    return any(o is obj for o in gc.get_objects())


def test_the_loaded_model_is_frozen_and_returned():
    gc.unfreeze()
    try:
        made = [[i, {"k": [i]}] for i in range(1000)]  # what the loader leaves behind
        assert _tracked(made[0])
        before = gc.get_freeze_count()
        assert loaded_and_frozen(lambda: made) is made
        assert gc.get_freeze_count() >= before + 3000
        assert not _tracked(made[0]) and not _tracked(made[-1][1])
        garbage = [[]]
        garbage[0].append(garbage)  # made after the load: still collected
        assert _tracked(garbage)
    finally:
        gc.unfreeze()
