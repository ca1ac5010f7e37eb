/* netns.h — two test "hosts" on one machine: two network namespaces joined
 * by a veth pair (interface veth0 on both sides, SUBNET.1 and SUBNET.2), for
 * the tests of what crosses a network (e2e/dist_netns, e2e/fed_netns).
 *
 *     int skip = netns_skip("fed_netns", "timeout");   // 77: print nothing more, return 77
 *     if (skip) return skip;
 *     CHECK(netns_open("tessel-fednet-", "10.78.0", NULL) == 0, "namespaces");
 *     system("ip netns exec ...");                     // netns_name(0), netns_name(1)
 *     long long rx = netns_veth_bytes(0, "rx");
 *     CHECK(netns_close(), "namespaces removed");
 *
 * Namespace names are PREFIX<pid>-a and PREFIX<pid>-b, so parallel runs do
 * not clash. They are removed on every path: netns_close, and SIGTERM,
 * SIGINT or SIGHUP (the handler runs a command prepared in advance, which
 * also kills what still runs in them); namespaces left by a run that was
 * killed outright (its pid gone) are removed by the next netns_open with
 * the same prefix. */
#ifndef TS_TEST_NETNS_H
#define TS_TEST_NETNS_H

/* 0 when namespaces can be made here; otherwise prints "TEST: skipped:
 * WHY" and returns 77. Needs root, `ip` (iproute2; /usr/sbin and /sbin are
 * added to PATH) and each of the space-separated `tools`, and a namespace
 * that can really be created (a container may lack CAP_SYS_ADMIN). */
int netns_skip(const char *test, const char *tools);

/* Creates the two namespaces and the veth pair between them, SUBNET.1/24 in
 * the first and SUBNET.2/24 in the second, both links up. `also` (may be
 * NULL) is a shell command run at cleanup after the namespaces are removed
 * (e.g. "rm -rf /tmp/x"). Returns 0, or -1 when a step fails. */
int netns_open(const char *prefix, const char *subnet, const char *also);

/* The name of host 0 or 1's namespace. */
const char *netns_name(int host);

/* Bytes received ("rx") or sent ("tx") by host's veth0 so far; -1 if unknown. */
long long netns_veth_bytes(int host, const char *dir);

/* Kills what runs in the namespaces, removes them and runs `also`.
 * Returns 1 when both namespaces are gone. */
int netns_close(void);

#endif
