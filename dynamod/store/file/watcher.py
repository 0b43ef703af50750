"""Which of the file store's directories changed: inotify on the event loop, else polling."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from pathlib import Path

from dynamod.store.file.inotify import Inotify

log = logging.getLogger(__name__)


class DirectoryWatcher:
    """Calls ``on_change(tags)`` on the event loop when watched directories change.

    ``directories`` maps a tag to a directory and the inotify event mask to watch it for.
    With inotify, ``on_change`` gets the tags of the directories that changed as soon as
    they change. Where inotify is unavailable, ``polling`` is true and ``on_change`` gets
    every tag each ``interval`` seconds: a bound on latency, not news of a change.
    ``on_change`` must not raise. ``start`` runs on the loop; ``aclose`` stops the feed
    (idempotent).
    """

    def __init__(
        self,
        directories: Mapping[str, tuple[Path, int]],
        on_change: Callable[[set[str]], None],
        *,
        interval: float,
    ) -> None:
        self._directories = directories
        self._on_change = on_change
        self._interval = interval
        self._notify: Inotify | None = None
        self._poller: asyncio.Task[None] | None = None

    @property
    def polling(self) -> bool:
        return self._poller is not None

    def start(self) -> None:
        try:
            self._notify = self._open_inotify()
        except OSError as exc:
            log.warning(
                "no inotify (%s): polling %s every %s s", exc, self._where(), self._interval
            )
            self._poller = asyncio.create_task(self._poll(), name=f"polling {self._where()}")
            return
        asyncio.get_running_loop().add_reader(self._notify.fileno(), self._readable, self._notify)

    async def aclose(self) -> None:
        notify, self._notify = self._notify, None
        if notify is not None:
            asyncio.get_running_loop().remove_reader(notify.fileno())
            notify.close()
        poller, self._poller = self._poller, None
        if poller is not None:
            poller.cancel()
            await asyncio.wait([poller])

    def _open_inotify(self) -> Inotify:
        notify = Inotify()
        try:
            for tag, (directory, mask) in self._directories.items():
                notify.add(directory, mask, tag)
        except OSError:
            notify.close()
            raise
        return notify

    def _readable(self, notify: Inotify) -> None:
        try:
            changed = notify.drain()
        except OSError as exc:
            log.warning("reading inotify for %s failed (%s); rechecking all", self._where(), exc)
            changed = set(self._directories)
        if changed:
            self._on_change(changed)

    async def _poll(self) -> None:
        while True:
            await asyncio.sleep(self._interval)
            self._on_change(set(self._directories))

    def _where(self) -> str:
        return ", ".join(str(directory) for directory, _ in self._directories.values())
