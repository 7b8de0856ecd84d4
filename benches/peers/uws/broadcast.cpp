// The uWebSockets peer for benches/peers.rs: the bench-peers broadcast workload on uWS's own
// topic fan-out, so tether's figures can be read as ratios against a C++ server measured in
// the same run. Written for this bench against uWS's public API (App.h); no uWS code is copied.
//
//   uws-broadcast PORT        (HOST env, default 127.0.0.1)
//
// /ws only. A text frame equal to {"op":"sub","ch":"bench"} subscribes the connection to the
// topic "bench" (once); a text frame starting with {"op":"pub" is published verbatim to that
// topic, i.e. sent as the same text frame to every subscriber. Anything else is ignored. No
// compression, no idle timeout and no automatic pings: the tokio-tungstenite peer of
// bench-peers has none either, and they would add work the other servers do not do.
// A subscriber whose unsent bytes exceed 16 MiB misses messages (uWS drops, it does not close),
// which the load tool counts as lost, as it counts the tokio-tungstenite peer's lagged ones.
// SIGTERM ends the process (default action): the bench starts a fresh server per run.

#include "App.h"

#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

namespace {

constexpr std::string_view kSub = "{\"op\":\"sub\",\"ch\":\"bench\"}";
constexpr std::string_view kPubPrefix = "{\"op\":\"pub\"";

struct Conn {
    bool subscribed = false;
};

}  // namespace

int main(int argc, char **argv) {
    int port = argc > 1 ? std::atoi(argv[1]) : 9003;
    const char *env_host = std::getenv("HOST");
    std::string host = env_host ? env_host : "127.0.0.1";
    uWS::App app;
    uWS::App::WebSocketBehavior<Conn> behavior;
    behavior.compression = uWS::DISABLED;
    behavior.maxPayloadLength = 1 << 20;
    behavior.idleTimeout = 0;
    behavior.maxBackpressure = 16 << 20;
    behavior.closeOnBackpressureLimit = false;
    behavior.sendPingsAutomatically = false;
    behavior.message = [&app](auto *ws, std::string_view message, uWS::OpCode op) {
        if (op != uWS::OpCode::TEXT) {
            return;
        }
        if (message.substr(0, kPubPrefix.size()) == kPubPrefix) {
            app.publish("bench", message, uWS::OpCode::TEXT);
        } else if (message == kSub && !ws->getUserData()->subscribed) {
            ws->getUserData()->subscribed = true;
            ws->subscribe("bench");
        }
    };
    app.ws<Conn>("/ws", std::move(behavior));
    bool listening = false;
    app.listen(host, port, [&](auto *socket) { listening = socket != nullptr; });
    if (!listening) {
        std::fprintf(stderr, "uws-broadcast: cannot listen on %s:%d\n", host.c_str(), port);
        return 1;
    }
    std::fprintf(stderr, "uws-broadcast listening on %s:%d/ws\n", host.c_str(), port);
    app.run();
    return 0;
}
