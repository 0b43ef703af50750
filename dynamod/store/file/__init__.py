"""The file store: the discovery store of one machine, a directory its processes share.

``store`` is the contract of ``base`` on that directory; ``journal`` (the change log and
revision counter, the commit point), ``keys`` (one file per key), ``leases`` (one file per
lease), ``lock`` (the flock every mutation holds), ``watcher`` (which directories changed)
and ``inotify`` (Linux's inotify through ctypes) are its parts.
"""

from dynamod.store.file.store import FileStore

__all__ = ["FileStore"]
