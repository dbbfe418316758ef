from twisted.application.service import ServiceMaker

crossbar = ServiceMaker(
    "crossbar",
    "crossbar.app.tap",
    "A sticky reverse proxy in front of a fleet of llama.cpp llama-server hosts.",
    "crossbar",
)
