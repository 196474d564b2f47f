"""The adversarial attacks of tests/attacks.py: none returns a wrong answer without a word, none crashes
without a named error."""

from __future__ import annotations

import attacks
import pytest


@pytest.mark.slow
def test_no_attack_is_silently_wrong_or_crashes(capsys):
    counts = attacks.main([])
    printed = capsys.readouterr().out
    assert not counts.get("WRONG") and not counts.get("CRASH"), printed
    assert counts.get("RIGHT", 0) > 350  # the attacks ran
    names = [name for name, _ in attacks.ATTACKS]
    assert len(set(names)) == len(names) == sum(counts.values())  # each attack registered and run once
