"""The spaces of ``drums/Desktop-v0`` (:mod:`drums_osworld.gym.env`) and the text space they are made of.

- observation: ``Dict(screenshot=Box(0, 255, (H, W, 3), uint8), instruction=Text)`` plus
  ``accessibility_tree=Text`` with ``require_a11y_tree=True``. The text spaces are
  :class:`UnicodeText`: any Unicode string up to a length (gymnasium's ``Text`` only holds a fixed
  character set, and instructions and accessibility trees are arbitrary text).
- action: :class:`UnicodeText`, pyautogui code as OSWorld's ``pyautogui`` action space sends it,
  or ``"WAIT"``, ``"DONE"``, ``"FAIL"``. A dict ``{"action_type": ...}`` or ``{"command": code}`` is
  accepted as OSWorld accepts it.
"""
from __future__ import annotations

import io
import string
from collections.abc import Sequence
from typing import Any

import numpy as np
from gymnasium import spaces
from gymnasium.vector.utils import shared_memory

from drums_core.errors import FailedPrecondition
from drums_core.reasons import Reason

__all__ = ["A11Y_MAX", "ACTION_MAX", "INSTRUCTION_MAX", "UnicodeText", "action_space", "observation_space",
           "screenshot_array"]

#: Longest instruction the observation space holds (characters).
INSTRUCTION_MAX = 16_384
#: Longest action: one ``python -c`` argument must stay under Linux's 128 KiB per-argument limit.
ACTION_MAX = 32_768
#: Default longest accessibility tree (characters); a longer tree is cut at an element boundary
#: (with a logged warning), so it still parses (drums_osworld.guest.a11y_guard).
A11Y_MAX = 1_000_000


class _AllCharacters:
    """Set-like: every Unicode character (what :class:`UnicodeText` holds)."""

    def __contains__(self, char: object) -> bool:
        return isinstance(char, str) and len(char) == 1

    def __len__(self) -> int:
        return 0x110000

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _AllCharacters)

    def __hash__(self) -> int:
        return hash(_AllCharacters)


class _CodePoints:
    """Sequence-like: index -> the character with that code point."""

    def __getitem__(self, index: Any) -> str:
        return chr(int(index))

    def __len__(self) -> int:
        return 0x110000


_SAMPLE_CHARSET = string.ascii_letters + string.digits + string.punctuation + " \n"


class UnicodeText(spaces.Text):
    """A :class:`gymnasium.spaces.Text` of any Unicode string of ``min_length..max_length`` characters.

    ``contains`` accepts every character; flattening (and ``AsyncVectorEnv``'s shared memory)
    stores code points. ``sample()`` draws from printable ASCII (letters, digits, punctuation,
    space, newline), and a ``mask``/``probability`` refers to that sample alphabet.
    """

    def __init__(self, max_length: int, *, min_length: int = 0, seed: int | np.random.Generator | None = None):
        super().__init__(max_length, min_length=min_length, charset=_SAMPLE_CHARSET, seed=seed)
        self._sampler = spaces.Text(max_length, min_length=min_length, charset=_SAMPLE_CHARSET)

    @property
    def character_set(self) -> Any:  # type: ignore[override]
        return _AllCharacters()

    @property
    def character_list(self) -> Any:  # type: ignore[override]
        return _CodePoints()

    def character_index(self, char: str) -> np.int32:
        return np.int32(ord(char))

    def sample(self, mask: Any = None, probability: Any = None) -> str:
        self._sampler._np_random = self.np_random
        return self._sampler.sample(mask=mask, probability=probability)

    def contains(self, x: Any) -> bool:
        return isinstance(x, str) and self.min_length <= len(x) <= self.max_length

    def __eq__(self, other: object) -> bool:
        return (isinstance(other, UnicodeText) and self.min_length == other.min_length
                and self.max_length == other.max_length)

    def __repr__(self) -> str:
        return f"UnicodeText({self.min_length}, {self.max_length})"


# AsyncVectorEnv(shared_memory=True) calls read_from_shared_memory once, at construction, and relies
# on the result being a live numpy view; gymnasium's Text reader returns strings, frozen at that
# moment (every later observation would read as the empty one). UnicodeText's batch is a live
# sequence instead: indexing decodes the row now, and a (deep) copy, which AsyncVectorEnv returns by
# default, is a tuple of the current strings. Code points travel as int32, padded with 0x110000.
_PAD = 0x110000


class _SharedTexts(Sequence):
    """The current strings of ``n`` sub-envs' :class:`UnicodeText` rows in shared memory."""

    def __init__(self, rows: np.ndarray) -> None:
        self._rows = rows

    def __len__(self) -> int:
        return self._rows.shape[0]

    def __getitem__(self, index: Any) -> Any:
        if isinstance(index, slice):
            return tuple(self[i] for i in range(*index.indices(len(self))))
        row = self._rows[index]
        end = np.flatnonzero(row == _PAD)
        codes = row[: end[0]] if end.size else row
        return codes.astype("<u4").tobytes().decode("utf-32-le", "surrogatepass")

    def __deepcopy__(self, memo: dict[int, Any]) -> tuple[str, ...]:
        return tuple(self)

    def __copy__(self) -> tuple[str, ...]:
        return tuple(self)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, (Sequence, _SharedTexts)) and tuple(self) == tuple(other)

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return repr(tuple(self))


@shared_memory.read_from_shared_memory.register(UnicodeText)
def _read_unicode_texts(space: UnicodeText, memory: Any, n: int = 1) -> _SharedTexts:
    return _SharedTexts(np.frombuffer(memory.get_obj(), dtype=np.int32).reshape((n, space.max_length)))


@shared_memory.write_to_shared_memory.register(UnicodeText)
def _write_unicode_text(space: UnicodeText, index: int, value: str, memory: Any) -> None:
    row = np.frombuffer(memory.get_obj(), dtype=np.int32)[index * space.max_length:(index + 1) * space.max_length]
    codes = np.frombuffer(value.encode("utf-32-le", "surrogatepass"), dtype="<u4")[: space.max_length]
    row[: codes.size] = codes
    row[codes.size:] = _PAD


def observation_space(screen_size: tuple[int, int], a11y_max_length: int | None) -> spaces.Dict:
    """The screenshot (``screen_size`` is width, height) and the instruction, plus the accessibility
    tree when ``a11y_max_length`` is given."""
    width, height = screen_size
    obs = {"screenshot": spaces.Box(0, 255, (height, width, 3), np.uint8),
           "instruction": UnicodeText(INSTRUCTION_MAX)}
    if a11y_max_length is not None:
        obs["accessibility_tree"] = UnicodeText(a11y_max_length)
    return spaces.Dict(obs)


def action_space() -> UnicodeText:
    """One action: pyautogui code, ``WAIT``, ``DONE`` or ``FAIL``."""
    return UnicodeText(ACTION_MAX, min_length=1)


def screenshot_array(png: bytes, screen_size: tuple[int, int]) -> np.ndarray:
    """A screenshot as the observation holds it: an (H, W, 3) uint8 array; a PNG of another size than
    ``screen_size`` fails ``SCREEN_SIZE_MISMATCH``."""
    from PIL import Image

    with Image.open(io.BytesIO(png)) as img:
        arr = np.array(img.convert("RGB"), dtype=np.uint8)
    width, height = screen_size
    if arr.shape != (height, width, 3):
        raise FailedPrecondition(f"the desktop's screenshot is {arr.shape[1]}x{arr.shape[0]}, "
                                 f"the observation space {width}x{height}", reason=Reason.SCREEN_SIZE_MISMATCH)
    return arr
