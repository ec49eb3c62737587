# Sourced by ./dev test: start what the integration tests need, export where it is.
# Under CI (CI=true) an engine that cannot start is a failure, not a skip.

start_services() {
    :
}

stop_services() {
    :
}
