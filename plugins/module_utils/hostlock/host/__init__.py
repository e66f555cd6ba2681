"""Host locks: the mechanisms on one machine (kernel ranges, owner files, leases, paths). What a managed
host needs; never imports the fleet or the command line."""
