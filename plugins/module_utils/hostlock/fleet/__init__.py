"""Fleet locks in etcd v3. Loaded only when a fleet URL is given (api loads it by name), so nothing of it
reaches a managed host in a module's payload."""
