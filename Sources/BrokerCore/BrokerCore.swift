// BrokerCore: the stores' semantics (ordered items, sequences, chains, events, subscriptions), with no
// networking and no dlopen. Not implemented yet: it arrives with the daemon issue. The target exists now
// so that the package has its final layers from the start.
import Wire
