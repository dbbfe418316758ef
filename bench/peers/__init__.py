"""crossbar beside the routers the field uses: nginx, smg and vllm-router in front of one
fixed-answer upstream (`peers.py`, its stage `peers_setup.py`, the bodies it posts
`agent_bodies.py`), the peers installed and launched (`peer_routers.py`), and builds of crossbar
alternated in one sitting (`crossbar_ab.py`)."""
