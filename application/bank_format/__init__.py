"""The bank format: reading and writing a bank's tar stream on an allow-list, its gzip,
its members and their spill log, the manifest line codec, link containment, the host
archive and the bank check. It never imports the use cases (an import-linter contract):
only the ports, the cancellation model and the domain."""
