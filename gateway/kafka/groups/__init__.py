"""Kafka consumer groups: the coordinator of the classic group protocol (JoinGroup,
SyncGroup, Heartbeat, LeaveGroup, DescribeGroups, ListGroups) and the groups' committed
offsets (OffsetCommit, OffsetFetch, OffsetDelete)."""
