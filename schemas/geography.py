"""A release's geography from public information (the config's ``geography``).

A release's nodes are declared, never read off the confidential rows (a node set taken from the
rows loses a PUMA when a neighbour removes its only household: :mod:`engine.data`):

- the states: ``geography.states``; absent, the states of the private files. Which states a
  release covers is part of its design (each private input is one state's PUMS file), so that set
  is public by declaration, as the manifest's ``invariants.public_structure`` states;
- each state's PUMAs: from a public PUMA list. PUMA definitions are published by the Census Bureau;
  the project ships the 2010-vintage list of the states of ``../shared/data``
  (``puma_lists/puma_2010.yaml``), and a config may name another list file in the same format
  (a path relative to ``data_root``, as an input). A PUMA of the list with no private household is
  released like every other node, from its noisy measurements.

A private record outside the declared geography is bad input (:func:`check_declared`).
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

import numpy as np
import yaml

from engine.data import Geography, node_key
from engine.errors import DPReleaseError
from schemas.domain_spec import DomainSpec
from schemas.pums_reader import InputError, InputIssue, PersonTable

PUMA_LISTS_DIR = Path(__file__).parent / "puma_lists"
DEFAULT_PUMA_LIST = "puma_2010"


class PumaListError(DPReleaseError, ValueError):
    """A PUMA list that cannot be read, or states it does not list."""


def puma_list_path(name: str, data_root: Path) -> Path:
    """A PUMA list's file: a ``.yaml``/``.yml`` path (relative to ``data_root``), or the name of a
    list shipped in ``schemas/puma_lists/``."""
    p = Path(name).expanduser()
    if p.suffix in (".yaml", ".yml"):
        return p if p.is_absolute() else (data_root / p).resolve()
    shipped = PUMA_LISTS_DIR / f"{name}.yaml"
    if not shipped.exists():
        known = sorted(f.stem for f in PUMA_LISTS_DIR.glob("*.yaml"))
        raise PumaListError(f"geography.pumas: no shipped PUMA list {name!r} (shipped: {known}; or give a .yaml file)")
    return shipped


def load_puma_list(path: Path) -> Geography:
    """Every PUMA of a list file (``vintage``, then ``states``: {ST: [PUMA, ...]}), parsed once per
    process and file version (every ingest task and the run's setup ask for it; a replaced file is
    read again)."""
    try:
        st = Path(path).stat()
    except OSError as e:
        raise PumaListError(f"{path}: cannot read the PUMA list ({e.strerror})") from None
    return _parsed_puma_list(str(path), st.st_ino, st.st_mtime_ns, st.st_size)


@lru_cache(maxsize=8)
def _parsed_puma_list(path: str, inode: int, mtime_ns: int, size: int) -> Geography:
    try:
        raw = yaml.safe_load(Path(path).read_text())
    except OSError as e:
        raise PumaListError(f"{path}: cannot read the PUMA list ({e.strerror})") from None
    except yaml.YAMLError as e:
        raise PumaListError(f"{path}: not valid YAML: {e}") from None
    states = raw.get("states") if isinstance(raw, dict) else None
    if not isinstance(states, dict) or not states:
        raise PumaListError(f"{path}: a PUMA list is a mapping with `states`: {{ST: [PUMA codes]}}")
    try:
        pumas = [(int(st), int(p)) for st, codes in states.items() for p in codes]
        return Geography.of(pumas)
    except (TypeError, ValueError) as e:
        raise PumaListError(f"{path}: each state's PUMAs must be a list of integer codes ({e})") from None


def shipped_puma_list(name: str = DEFAULT_PUMA_LIST) -> Geography:
    """A PUMA list shipped in ``schemas/puma_lists/``."""
    return load_puma_list(puma_list_path(name, PUMA_LISTS_DIR))


def declared(puma_list: Geography, states: list[int] | None) -> Geography:
    """The PUMAs of ``states`` in the list: the release's nodes (``tasks.ingest.release_geography``),
    or, ``states`` None (taken from the private files), every PUMA of the list: what the private
    records are checked against."""
    if states is None:
        return puma_list
    try:
        return puma_list.restricted(states)
    except ValueError:
        missing = sorted(set(states) - set(puma_list.states))
        raise PumaListError(f"geography.states: states {missing} are not in the PUMA list (it lists {list(puma_list.states)}): "
                            "give geography.pumas a list that has them") from None


def check_declared(t: PersonTable, spec: DomainSpec, geography: Geography) -> None:
    """Refuse a private file with a record outside ``geography``: the file, the first such line,
    the column (the state's, or the PUMA's when the state is declared) and the declared set."""
    st_col, puma_col = spec.geography[:2]
    geo = np.stack([t.cols[st_col], t.cols[puma_col]], axis=1)
    outside = geography.outside(geo)
    if not outside.any():
        return
    i = int(np.flatnonzero(outside)[0])
    state = int(geo[i, 0])
    if state not in geography.states:
        column = st_col
        msg = f"a state outside the declared geography (declared states: {', '.join(f'{s:02d}' for s in geography.states)})"
    else:
        column = puma_col
        pumas = ", ".join(f"{p:05d}" for s, p in geography.pumas if s == state)
        msg = f"a PUMA outside the declared geography (declared PUMAs of {node_key((state,))}: {pumas})"
    raise InputError([InputIssue(t.name, msg + "; the release's geography is declared by geography.states and geography.pumas",
                                 line=int(t.line[i]), column=column, check="geography")])
