"""Weight sync: how the trainer's weights reach the explorers.

    trainer rank 0 --publisher--> weights/v<N>/ (full, or a delta vs an anchor) + pointer
                   --broadcast--> vLLM workers (sync_method: nccl; a folder when it fails)
    explorer <--watcher-- pointer + complete folders; heartbeat says what it loaded/loads

Modules: ``schedule`` (when), ``versions`` (folders, pointer), ``publisher``, ``watcher``,
``heartbeat``, ``delta`` (XOR+zstd encoding, node-local copies), ``broadcast`` (the protocol).
"""
