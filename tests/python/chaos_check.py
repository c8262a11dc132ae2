"""The checker of a chaos run (chaos_run.py): from what the clients and the publisher saw alone,
counts per fault window what was lost without notice, duplicated, out of order or announced,
the disconnects and `unsubscribed` pushes, recovery times and healthy-channel stalls, and
decides `"pass"`. See chaos_run.py's docstring for what each figure means."""

from __future__ import annotations


def pct(values: list, q: float):
    if not values:
        return None
    v = sorted(values)
    return round(v[min(len(v) - 1, int(q * (len(v) - 1) + 0.5))], 3)


def check(run) -> dict:
    sc = run.sc
    pubs = run.publisher.records
    by_pid = {r["seq"]: r for r in pubs}
    # what the publisher was answered: (channel, epoch) -> {offset: seq}
    answered: dict = {}
    reused = []
    for r in pubs:
        if r["answer"] is None:
            continue
        e, o = r["answer"]
        slot = answered.setdefault((r["ch"], e), {})
        if o in slot and slot[o] != r["seq"]:
            reused.append({"channel": r["ch"], "epoch": e, "offset": o, "pids": [slot[o], r["seq"]]})
        slot[o] = r["seq"]
    final = run.final_positions()

    faults = sorted(run.faults, key=lambda d: d["t"])
    bounds = [f["t"] for f in faults]

    def window(t: float) -> int:
        """0 before the first fault, i+1 from fault i to the next."""
        w = 0
        for i, b in enumerate(bounds):
            if t >= b:
                w = i + 1
        return w

    nwin = len(faults) + 1
    win = [{"lost": [], "duplicated": [], "order": [], "gaps": [], "disconnects": [], "unsubscribes": []}
           for _ in range(nwin)]

    def pub_time(ch: str, e: str, o: int):
        seq = answered.get((ch, e), {}).get(o)
        if seq is None:
            return None, None
        r = by_pid[seq]
        return seq, r["attempts"][0][0] if r["attempts"] else r["t_due"]

    # the epochs the publisher was answered, per channel: [epoch, first offset, last offset,
    # first answer t, last answer t], in answer order
    epochs: dict = {}
    for r in sorted((r for r in pubs if r["answer"] is not None), key=lambda r: r["t_ok"]):
        e, o = r["answer"]
        runs = epochs.setdefault(r["ch"], [])
        if runs and runs[-1][0] == e:
            runs[-1][1], runs[-1][2] = min(runs[-1][1], o), max(runs[-1][2], o)
            runs[-1][4] = round(r["t_ok"], 3)
        else:
            runs.append([e, o, o, round(r["t_ok"], 3), round(r["t_ok"], 3)])
    epoch_changes = {ch: runs for ch, runs in epochs.items() if len(runs) > 1}

    expected = 0
    delivered = 0
    misnumbered, across_epochs, unacked = [], 0, 0
    across_samples: list = []
    redelivered = 0
    redelivered_samples: list = []
    for cl in run.clients:
        for ch, st in cl.ch.items():
            delivered += len(st.deliveries)
            got: dict = {}
            pid_seen: dict = {}
            for (t, e, o, pid, how, conn) in st.deliveries:
                got.setdefault(e, set()).add(o)
                if pid is not None and pid >= 0:
                    if pid in pid_seen and pid_seen[pid][0] != e:
                        redelivered += 1
                        if len(redelivered_samples) < 20:
                            redelivered_samples.append({"client": cl.cid, "channel": ch, "pid": pid,
                                                        "first": pid_seen[pid], "again": [e, o, round(t, 3), how]})
                    else:
                        pid_seen[pid] = [e, o, round(t, 3), how]
                r = by_pid.get(pid) if pid is not None and pid >= 0 else None
                if r is None:
                    continue
                if r["answer"] is None:
                    unacked += 1
                elif r["answer"][0] == e and r["answer"][1] != o:
                    misnumbered.append({"client": cl.cid, "channel": ch, "epoch": e, "offset": o, "pid": pid,
                                        "answered": r["answer"], "t": round(t, 3)})
                elif r["answer"][0] != e:
                    across_epochs += 1
                    if len(across_samples) < 20:
                        across_samples.append({"client": cl.cid, "channel": ch, "pid": pid, "delivered": [e, o],
                                               "answered": list(r["answer"]), "t": round(t, 3), "how": how})
            for i, (e, start, end, t_open, how) in enumerate(st.spans):
                if end is None:
                    top = max(answered.get((ch, e), {0: None}).keys(), default=0)
                    end = max(top, st.last if st.epoch == e else 0)
                expected += max(0, end - start)
                have = got.get(e, set())
                for o in range(start + 1, end + 1):
                    if o not in have:
                        seq, t_pub = pub_time(ch, e, o)
                        item = {"client": cl.cid, "channel": ch, "epoch": e, "offset": o, "pid": seq,
                                "published_t": None if t_pub is None else round(t_pub, 3),
                                "span": [start, end], "span_opened_t": round(t_open, 3), "span_how": how,
                                "client_conns": [[round(a, 3), None if b is None else round(b, 3), n]
                                                 for a, b, n, _ in cl.conns
                                                 if t_pub is None or (b is None or b > t_pub - 5) and a < t_pub + 30]}
                        win[window(t_pub if t_pub is not None else t_open)]["lost"].append(item)
            # left in an older epoch than the channel's last one, never told
            if ch in final and st.epoch is not None and st.epoch != final[ch][0]:
                fe, fo = final[ch]
                for o in range(1, fo + 1):
                    seq, t_pub = pub_time(ch, fe, o)
                    win[window(t_pub if t_pub is not None else run.t_end)]["lost"].append(
                        {"client": cl.cid, "channel": ch, "epoch": fe, "offset": o, "pid": seq,
                         "published_t": None if t_pub is None else round(t_pub, 3),
                         "why": f"client still in epoch {st.epoch} at offset {st.last}, never told of {fe}"})
                    expected += 1
        for v in cl.violations:
            w = win[window(v["t"])]
            (w["duplicated"] if v["kind"] == "duplicate" else w["order"]).append(v)
        for g in cl.gaps:
            win[window(g["t"])]["gaps"].append(g)
        for d in cl.disconnects:
            win[window(d["t"])]["disconnects"].append(d)
        for u in cl.unsubscribes:
            win[window(u["t"])]["unsubscribes"].append(u)

    # publisher attempts by window
    pub_win = [{"200": 0, "503": 0, "504": 0, "other": 0, "conn_error": 0} for _ in range(nwin)]
    others = []
    for r in pubs:
        for att in r["attempts"]:
            s = att[3]
            key = "200" if s == 200 else "503" if s == 503 else "504" if s == 504 else "conn_error" if s == "conn" \
                else "other"
            pub_win[window(att[0])][key] += 1
            if key == "other" and len(others) < 20:
                others.append({"seq": r["seq"], "channel": r["ch"], "attempt": att})
    gave_up = [r["seq"] for r in pubs if r["answer"] is None]

    def summarize_window(i: int) -> dict:
        w = win[i]
        codes: dict = {}
        delays = []
        for d in w["disconnects"]:
            k = str(d["code"]) + "+close " + str(d["close_code"]) if d["code"] is not None else "close " + str(
                d["close_code"])
            codes[k] = codes.get(k, 0) + 1
            if d["close_after_s"] is not None:
                delays.append(d["close_after_s"])
        return {"lost_without_notice": len(w["lost"]), "duplicated": len(w["duplicated"]),
                "announced_gaps": len(w["gaps"]), "order_violations": len(w["order"]),
                "disconnects": codes, "unsubscribed_pushes": len(w["unsubscribes"]),
                "close_frame_after_disconnect_s": {"p50": pct(delays, 0.5), "max": max(delays, default=None)},
                "publisher": pub_win[i]}

    out_faults = []
    t_stop = run.t_end
    for i, f in enumerate(faults):
        ft = f["t"]
        w_end = bounds[i + 1] if i + 1 < len(bounds) else t_stop
        s = summarize_window(i + 1)
        s.update({k: f[k] for k in f if k not in ("at",)})
        after = [d["t"] - ft for d in win[i + 1]["disconnects"]]
        s["disconnect_after_fault_s"] = {"n": len(after), "first": pct(after, 0.0), "p50": pct(after, 0.5),
                                         "max": pct(after, 1.0)}
        affected = set(f.get("affected", []))
        # which (client, channel) pairs the fault touches
        pairs_aff, pairs_ok = [], []
        for cl in run.clients:
            node = cl.node_at(ft)
            for ch in cl.channels:
                if f["kind"] in ("node", "latency", "pause", "reset"):
                    hit = node == f["node"]
                else:
                    hit = ch in affected
                (pairs_aff if hit else pairs_ok).append((cl, ch))
        # recovery per affected client: fault -> first delivery after it on an affected pair
        first: dict = {}
        first_new: dict = {}
        for cl, ch in pairs_aff:
            for (t, e, o, pid, how, conn) in cl.ch[ch].deliveries:
                if t > ft:
                    first[cl.cid] = min(first.get(cl.cid, 1e9), t - ft)
                    break
            for (t, e, o, pid, how, conn) in cl.ch[ch].deliveries:
                r = by_pid.get(pid) if pid is not None and pid >= 0 else None
                if t > ft and r is not None and r["attempts"] and r["attempts"][0][0] > ft:
                    first_new[cl.cid] = min(first_new.get(cl.cid, 1e9), t - ft)
                    break
        clients_aff = {cl.cid for cl, _ in pairs_aff}
        rec = list(first.values())
        s["recovery_s"] = {"clients": len(clients_aff), "p50": pct(rec, 0.5), "max": pct(rec, 1.0),
                           "never": len(clients_aff - set(first))}
        recn = list(first_new.values())
        s["first_new_publication_s"] = {"p50": pct(recn, 0.5), "max": pct(recn, 1.0),
                                        "never": len(clients_aff - set(first_new))}
        # healthy pairs: the longest time without a delivery in [fault, fault + stall_window]
        hw_end = min(w_end, ft + sc.stall_window)
        commits: dict = {}
        for r in pubs:
            if r["t_ok"] is not None:
                commits.setdefault(r["ch"], []).append(r["t_ok"])
        for v in commits.values():
            v.sort()

        def longest_gap_at(times: list) -> tuple:
            """(longest gap, its start, its end) in [fault, fault + stall_window]."""
            prev = max([x for x in times if x <= ft], default=ft)
            worst = (0.0, prev, prev)
            for x in times:
                if ft < x <= hw_end:
                    if x - prev > worst[0]:
                        worst = (x - prev, prev, x)
                    prev = x
            return worst if worst[0] >= hw_end - prev else (hw_end - prev, prev, hw_end)

        def longest_gap(times: list) -> float:
            return longest_gap_at(times)[0]

        stalls = []
        for cl, ch in pairs_ok:
            times = [d[0] for d in cl.ch[ch].deliveries]
            stalls.append((longest_gap(times), cl.cid, ch))
        if stalls:
            stalls.sort(reverse=True)
            g, cid, ch = stalls[0]
            per_channel: dict = {}
            for gg, _, c in stalls:
                per_channel[c] = max(per_channel.get(c, 0), gg)
            s["healthy_stall_s"] = {
                "pairs": len(stalls), "max": round(g, 3), "p50": pct([x[0] for x in stalls], 0.5),
                "worst": {"client": cid, "channel": ch,
                          "from_to_after_fault_s": [round(x - ft, 3) for x in longest_gap_at(
                              [d[0] for d in next(c for c in run.clients if c.cid == cid).ch[ch].deliveries])[1:]],
                          "commit_gap_s": round(longest_gap(commits.get(ch, [])), 3),
                          "commit_gap_from_to_after_fault_s": [round(x - ft, 3) for x in
                                                               longest_gap_at(commits.get(ch, []))[1:]]},
                "over_1s": sum(1 for x in stalls if x[0] > 1.0),
                "per_channel_max": {c: round(v, 3) for c, v in sorted(per_channel.items(),
                                                                      key=lambda kv: -kv[1])[:10]},
                "window_s": [round(ft, 3), round(hw_end, 3)],
                "publication_period_per_channel_s": round(len(run.channels) / sc.rate, 3)}
        else:
            s["healthy_stall_s"] = None
        # publisher: first 200 after the fault, any channel and an affected one
        oks = [(r["t_ok"], r) for r in pubs if r["t_ok"] is not None and r["t_ok"] > ft]
        s["publisher"]["first_200_after_s"] = round(min(t for t, _ in oks) - ft, 3) if oks else None
        aff_oks = [t for t, r in oks if r["ch"] in affected and r["attempts"][0][0] > ft]
        s["publisher"]["first_200_affected_after_s"] = round(min(aff_oks) - ft, 3) if aff_oks else None
        lat = [r["t_ok"] - r["attempts"][0][0] for r in pubs
               if r["t_ok"] is not None and ft <= r["attempts"][0][0] < w_end]
        s["publisher"]["publish_latency_max_s"] = round(max(lat), 3) if lat else None
        lag = [x for t, x in run.loop_lag if ft <= t < w_end]
        s["checker_loop_lag_max_s"] = round(max(lag), 3) if lag else None
        out_faults.append(s)

    def cap(items: list, n: int = 40) -> list:
        return items[:n]

    lost = [x for w in win for x in w["lost"]]
    dups = [x for w in win for x in w["duplicated"]]
    order = [x for w in win for x in w["order"]]
    gaps = [x for w in win for x in w["gaps"]]
    last_fault = bounds[-1] if bounds else 0.0
    silent_clients = [cl.cid for cl in run.clients
                      if not any(d[0] > last_fault + 0.5 for st in cl.ch.values() for d in st.deliveries)]
    all_disc: dict = {}
    for w in win:
        for d in w["disconnects"]:
            k = f"{d['code']}/{d['close_code']}"
            all_disc[k] = all_disc.get(k, 0) + 1
    stuck = {}
    for cl in run.clients:
        for ch, st in cl.ch.items():
            if ch in final and (st.epoch != final[ch][0] or st.last < final[ch][1]):
                stuck[f"{cl.cid}/{ch}"] = {"client": [st.epoch, st.last], "channel": list(final[ch])}
    committed = sum(1 for r in pubs if r["answer"] is not None)
    criteria = {
        "lost without notice = 0": len(lost) == 0,
        "duplicated = 0": len(dups) == 0,
        "order violations = 0": len(order) == 0,
        "every delivered offset is the one answered to the publisher": not misnumbered,
        "no offset answered for two publications": not reused,
        "every client got deliveries after the last fault": not silent_clients,
        "a failed shard or primary disconnects no client": all(
            not f["disconnects"] for f in out_faults if f["kind"] in ("primary", "shard")),
    }
    report = {
        "scenario": sc.name, "topology": sc.topology,
        "params": {"nodes": sc.nodes, "clients": sc.clients, "channels": sc.channels,
                   "channels_per_client": sc.subs or sc.channels, "publications_per_s": sc.rate,
                   "duration_s": sc.duration, "faults": [f.__dict__ for f in sc.faults],
                   "clients_wait_for_close_frame": sc.wait_close, "cluster_full_coverage": sc.full_coverage},
        "totals": {
            "publications_committed": committed, "publications_given_up": len(gave_up),
            "deliveries_expected": expected, "deliveries": delivered,
            "lost_without_notice": len(lost), "duplicated": len(dups), "announced_gaps": len(gaps),
            "order_violations": len(order), "misnumbered": len(misnumbered), "offsets_reused": len(reused),
            "delivered_in_another_epoch_than_answered": across_epochs, "delivered_but_never_answered": unacked,
            "redelivered_in_a_new_epoch": redelivered,
            "channels_whose_epoch_changed": len(epoch_changes),
            "pubs_after_disconnect_message": sum(cl.pubs_after_disconnect for cl in run.clients),
            "disconnects_msg_code/close_code": all_disc,
            "subscribe_errors": _merge([cl.sub_errors for cl in run.clients]),
            "clients_behind_at_end": len(stuck),
            "checker_loop_lag_max_s": round(max((x for _, x in run.loop_lag), default=0), 3),
            "publisher_late_max_s": round(run.publisher.late_max, 3),
        },
        "load_started_t": round(run.t_load, 3), "publishing_ended_t": round(run.t_pub_end, 3),
        "before_faults": summarize_window(0),
        "faults": out_faults,
        "evidence": {
            "lost_without_notice": cap(lost), "duplicated": cap(dups), "order_violations": cap(order),
            "announced_gaps": cap(gaps, 20), "misnumbered": cap(misnumbered), "offsets_reused": cap(reused),
            "publisher_other_statuses": others,
            "epochs_answered_to_the_publisher": dict(list(epoch_changes.items())[:20]),
            "delivered_in_another_epoch_than_answered": across_samples,
            "redelivered_in_a_new_epoch": redelivered_samples, "publications_given_up": cap(gave_up),
            "clients_behind_at_end": dict(list(stuck.items())[:20]), "silent_clients": silent_clients,
        },
        "criteria": criteria,
        "pass": all(criteria.values()),
    }
    return report


def _merge(dicts: list) -> dict:
    out: dict = {}
    for d in dicts:
        for k, v in d.items():
            out[str(k)] = out.get(str(k), 0) + v
    return out


