"""Weight sync: how the trainer's weights reach the explorers.

    trainer rank 0 --publisher--> weights/v<N>/ (full, or a delta vs an anchor) + pointer
                   --broadcaster--> vLLM workers (sync_method: nccl; a folder when it fails)
    explorer <--watcher/receiver-- pointer + complete folders, or the broadcast (WeightsIn)
Also: ``schedule``, ``versions`` (folders, pointer), ``heartbeat``, ``delta`` + ``delta_files``
(deltas), ``local`` (anchors, local copies), ``broadcast`` (protocol), ``explorer_side``.
"""
