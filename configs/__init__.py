"""The gin files that ship with rlax; ``rlax run --gin NAME`` finds ``NAME.gin`` here.

Paths written in these files (``INIT_CHECKPOINT``) are relative to this folder,
so the packaged configs find the packaged assets (``../assets``) wherever
rlax is installed.
"""
