"""Peer mechanisms for the benchmarks (not used by any release): AIM and MST of McKenna et al.,
adapted from the reference implementations in private-pgm (``mechanisms/aim.py``, ``mst.py``,
``mechanism.py``, ``cdp2adp.py``, github.com/ryan112358/private-pgm @ 4d2b3c5) onto the API of
``mbi`` 2.0.0 (install with ``pip install -e '.[bench]'``); PMW-Pub of Liu et al. on the public
support (``pmw_pub.py``, numpy and scipy only), the synthesis benchmark's MWEM baseline."""
