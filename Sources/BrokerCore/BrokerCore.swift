// BrokerCore: the stores' semantics (ordered items, sequences, chains, events, subscriptions), with no
// networking and no dlopen. So far it declares the storage engine interface (StorageEngine.swift); the store
// semantics arrive with the daemon issue.
