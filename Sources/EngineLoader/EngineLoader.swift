// EngineLoader: finds storage engines on the search path and loads them with dlopen through the versioned
// C ABI. Not implemented yet: it arrives with the engine issue.
import BrokerCore
