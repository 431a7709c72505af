#if canImport(Glibc)
import Glibc
#endif
import BrokerCore
import Crypto
import NIOCore
import Wire

/// Secure values at rest: AES-256-GCM (swift-crypto) with a key kept in `DATA/secure-values.key`.
///
/// The key file is 32 random bytes, created with mode 0600 on first start. An existing key file must be a
/// regular file owned by the daemon's user with no permission for group or others; otherwise the daemon
/// refuses to start rather than use (or replace) it. Each value is sealed with a fresh random nonce and its
/// name as authenticated data: stored bytes are `nonce (12) | ciphertext | tag (16)`.
struct KeyFileSealer: ValueSealer {
    static let fileName = "secure-values.key"
    /// The raw key (SymmetricKey is not Sendable in this swift-crypto); a SymmetricKey is made per use.
    private let keyBytes: [UInt8]

    private var key: SymmetricKey { SymmetricKey(data: keyBytes) }

    static func load(dataDirectory: String) throws(DaemonError) -> KeyFileSealer {
        let path = dataDirectory + "/" + fileName
        var info = stat()
        if lstat(path, &info) != 0 {
            guard errno == ENOENT else { throw DaemonError.system(.secureValueKey, "cannot inspect \(path)") }
            return KeyFileSealer(keyBytes: try create(path))
        }
        guard info.st_mode & S_IFMT == S_IFREG else {
            throw DaemonError(.secureValueKey, "the secure-value key \(path) is not a regular file; refusing to use it")
        }
        guard info.st_uid == getuid() else {
            throw DaemonError(
                .secureValueKey, "the secure-value key \(path) belongs to uid \(info.st_uid), not to this user (\(getuid())); refusing to use it")
        }
        guard info.st_mode & 0o077 == 0 else {
            throw DaemonError(
                .secureValueKey, "the secure-value key \(path) has mode 0\(String(info.st_mode & 0o777, radix: 8)); it must be readable by "
                    + "its owner only (chmod 600); refusing to use it")
        }
        let fd = Glibc.open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW)
        guard fd >= 0 else { throw DaemonError.system(.secureValueKey, "cannot open \(path)") }
        defer { close(fd) }
        var bytes = [UInt8](repeating: 0, count: 64)
        let count = read(fd, &bytes, bytes.count)
        guard count == 32 else {
            throw DaemonError(.secureValueKey, "the secure-value key \(path) must hold exactly 32 bytes; it holds \(max(count, 0))")
        }
        return KeyFileSealer(keyBytes: Array(bytes[..<32]))
    }

    private static func create(_ path: String) throws(DaemonError) -> [UInt8] {
        let key = SymmetricKey(size: .bits256).withUnsafeBytes { Array($0) }
        let fd = Glibc.open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0o600)
        guard fd >= 0 else { throw DaemonError.system(.secureValueKey, "cannot create \(path)") }
        defer { close(fd) }
        let written = key.withUnsafeBytes { write(fd, $0.baseAddress, $0.count) }
        guard written == 32, fsync(fd) == 0 else {
            unlink(path)
            throw DaemonError.system(.secureValueKey, "cannot write \(path)")
        }
        return key
    }

    func seal(_ plaintext: ByteBuffer, name: String) throws(BrokerError) -> ByteBuffer {
        do {
            let box = try AES.GCM.seal(
                Array(plaintext.readableBytesView), using: key, authenticating: Array(name.utf8))
            guard let combined = box.combined else {
                throw BrokerError(.internalError, "cannot encrypt secure value \(name): AES-GCM gave no combined box")
            }
            return ByteBuffer(bytes: combined)
        } catch let error as BrokerError {
            throw error
        } catch {
            throw BrokerError(.internalError, "cannot encrypt secure value \(name): \(error)", underlying: error)
        }
    }

    func open(_ sealed: ByteBuffer, name: String) throws(BrokerError) -> ByteBuffer {
        do {
            let box = try AES.GCM.SealedBox(combined: Array(sealed.readableBytesView))
            return ByteBuffer(bytes: try AES.GCM.open(box, using: key, authenticating: Array(name.utf8)))
        } catch {
            throw BrokerError(
                .engineError,
                "cannot decrypt secure value \(name): the key file does not match the data, or it is corrupt",
                underlying: error)
        }
    }
}
