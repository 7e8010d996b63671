"""Meridian's own policy: every option priced in seconds, the cheapest one taken.

For one request the options are each local replica that admits a request now,
each healthy local replica held back by the admission limit (reached by
waiting in the regional queue until it admits again), and each available peer
region.  Each is priced as the time to the request's first token plus the harm
it does to the requests already running there; the request goes where that is
lowest.  Forwarding and waiting are options like any other, so the balancer
forwards or queues only when that is genuinely cheaper than a local replica.
``core.remote.place`` asks ``choose`` (the ``CostModel`` protocol)
instead of running SkyLB's local-first rule; the plain ``select`` scores the
given candidates only, for callers with no peers or queue.

Terms (seconds unless said), and where each number comes from:

* ``p(r)``: prefill seconds per uncached prompt token on replica ``r``.
  Starts at ``prefill_s_per_token`` (the engine profile's: Llama-3.1-8B on an
  L4, 0.53 ms; 0.04 ms on an H100) and is learned online: every first token
  that reaches the balancer gives a sample ``(TTFT - rtt(r) - step_s) /
  (Q at dispatch + U)``, folded into an EWMA (``ewma_alpha``).  Samples over
  fewer than ``min_sample_tokens`` tokens are skipped (one step's overhead
  dominates them) and samples are clamped to 1/8..8x the default.
* ``rtt(r)``: the round trip from this balancer to ``r``, from the topology
  (``TargetState.extra["rtt_ms"]``, the replica's ``ReplicaSpec.rtt_ms``), at
  least ``local_rtt_s``.  A balancer may own replicas in other regions (after
  a failover, or one balancer for every region): a TTFT measured here carries
  their 80-200 ms round trip, and a rate learned with one local round trip
  folded it into the per-token rate (Mooncake on H100s, one balancer in
  us-east: 0.09-0.16 ms per token learned abroad against the engine's 0.04),
  which priced remote replicas 2-4x too slow to prefill and piled cold
  prompts onto the near ones.  The round trip is priced once, in ``ttft(r)``.
* ``itl(r)``: seconds per output token on ``r``, ``itl_s`` by default (one
  decode step of the profile), learned from ``(finish - first token) /
  (output tokens - 1)`` by the same EWMA.  It prices how soon a replica whose
  KV look-ahead is full frees room (``pressure`` below).
* ``s``: what one more running sequence adds to a decode step, ``seq_s`` (the
  profile's per-sequence GEMM share plus attention reads of ~1k tokens of
  context: 0.75 ms on an L4).  Not learned: a sample ``(itl - step_s) / D``
  also carries the prefill chunks that shared those steps, and regions whose
  learned ``s`` drifted apart forwarded to each other under equal load
  (symmetric conversations, 120 s: 17.4 % forwarded, TTFT p90 0.44 s).
* ``Q(r)``: queued prefill work: the uncached prompt tokens of requests this
  balancer sent to ``r`` whose first token has not come back yet.  The
  balancer owns its replicas, so its ledger is the whole queue.
* ``U(r)``: this prompt's uncached tokens on ``r``: the prompt less
  ``block_tokens`` x the blocks of the longest prefix ``r`` holds, from an
  approximate radix tree of what was sent to each replica (SGLang's tree,
  bounded per replica by ``max_blocks_per_target``, the engine's KV capacity,
  so it forgets roughly what the engine's LRU would have evicted).  Each
  prompt's path is inserted again at its first token (the engine has just stored
  its blocks) and at its finish (it has just freed them), so the tree dates a
  block by its use, as the engine's LRU does: dated by routing alone, it forgot
  conversations the engines still held while their turns queued (ShareGPT on
  8k-token caches: 3.52 to 3.75 req/s of goodput; small-KV conversations 1 %
  less over three seeds; Mooncake's hit ratio over twenty-one rates as before;
  ``docs/results.md``, *The tree dated by use*).  With ``tree_from_kv_events``,
  a replica whose engine publishes KV events (vLLM's ``BlockRemoved``) has its
  hold cut where the engine evicted and its bound raised to twice the cache as a
  memory cap (``TreeEvictions``).  Off by default: on the emulated engines it
  served 1.02x the goodput on ShareGPT with 8k-token caches but 0.99x on mixed
  ToT over ten seeds (``docs/results.md``, *The tree by the engines'
  evictions*).
* ``ttft(r) = rtt(r) + step_s + (Q(r) + U(r)) * p(r)``: FCFS prefill
  behind the queued work, plus one step and the round trip.
* ``harm(r) = harm_weight * U(r) * p0 * D(r)``: chunked prefill shares steps
  with the ``D(r)`` requests decoding on ``r`` (first token seen, not
  finished), and each of them is delayed by this prompt's prefill compute (a
  step carrying a prefill chunk lasts as long as the engine computes the
  chunk): ``p0`` is ``prefill_s_per_token``, the profile's compute rate, not
  the learned ``p(r)``.  A first token's wait, which ``p(r)`` learns from,
  also carries the decode work that shared its steps and the queue ahead of
  it, which stall no one: on a busy replica it reads 1.6-2.6x ``p0``, and pricing
  harm at it kept a tree's siblings on a holder whose batch was full (mixed
  ToT on SGLang's engines, seeds 1-3 over 10 s: 291.43 against 323.74 with
  ``p0``; docs/results.md, *A full batch, and harm at the engine's rate*).
  ``harm_weight`` is 1: a second of someone else's delay counts as much as
  one of this request's own wait.  At 0.1 a cold replica's prefill looked
  nearly free to the fleet, so the model gave up hits (and forwarded) to save
  a little of its own TTFT; in a closed loop that recomputation is what caps
  throughput.
  ``D(r)`` counts no request still waiting for its first token, so a replica
  prefilling long prompts stays cheap for the next one (Azure at 4x its rate:
  16 of 18 4k-token prompts sent in 25 s went to three replicas).  Counting those as
  decoders too (they decode by the time this prefill runs) took Azure's TTFT
  p90 from 1.20 to 1.05 s but lost Mooncake's hits (hit/bound 0.99 to 0.87:
  a document's holder is where its prompts queue); not kept (docs/results.md,
  *The two traces replayed faster*).
* ``pressure(r)``: PreServe's load anticipation (§4.3.1): ``K(r)``, the KV
  tokens ``r`` will hold over the next ``lookahead_tokens`` decode steps, is
  the sum over its in-flight requests of ``U + min(predicted output,
  lookahead_tokens)`` (each one's uncached prompt where it was sent: a prefix
  the replica caches is held once, however many running requests share it,
  as the engine's paged KV does), at least ``kv_usage`` x
  ``kv_capacity_tokens`` from the latest probe (``observe_probe``, which the
  router calls with every probe it records).  With this request added, the
  ``overflow = K(r) + U(r) + min(pred, L) - kv_capacity_tokens`` tokens do not
  fit: the engine holds the newcomer (or preempts a running request) until
  that much KV is freed.  Counting whole prompts instead made a replica whose
  running requests share a 2k-token system prompt look several times fuller
  than it is, and sent a cold turn where its holder had room (small-KV
  conversations, 60 s: 15.1 to 16.0 req/s).  A turn whose own history is
  cached but held by no running request re-pins it, so ``U`` undercounts by at
  most that history.  The
  held KV drains as its requests finish, over about one request lifetime
  there (``out(r) x itl(r)``, ``out(r)`` the EWMA of output lengths finished
  on ``r``), so ``pressure(r) = overflow * out(r) * itl(r) / K(r)`` when
  ``overflow > 0``, else 0.
* Predicted output length: ``request.predicted_output_tokens`` when a
  predictor filled it in, else the mean output length this balancer has seen
  (EWMA, starting at ``default_output_tokens``), capped by ``max_tokens``.
* ``slot(r)``: the engine runs at most ``max_num_seqs`` sequences (vLLM's
  ``max_num_seqs``, SGLang's ``max_running_requests``; 256 by default, the
  profile's in the simulator); past them a newcomer waits for one to finish.
  With ``n(r)`` requests this balancer has in flight there, ``excess = n(r) +
  1 - max_num_seqs`` of them start only as running ones end, and the running
  ones end at ``max_num_seqs`` per request lifetime: ``slot(r) = excess *
  out(r) * itl(r) / max_num_seqs`` when ``excess > 0``, else 0.  Admission
  counts prefill tokens, which a tree's siblings add few of: without this
  term they all waited on the holder's full batch while other replicas had
  room (mixed ToT on SGLang's engines, seed 1: outstanding requests per
  replica varied 5x as much as under SGL's router, and every engine step that
  left requests waiting left them for a batch slot).
* ``cost(r) = ttft(r) + slot(r) + harm(r) + pressure(r)`` for a replica that admits.
* ``decode(r) = decode_weight * (step_s + (D(r) + 1 + harm_weight * D(r)) *
  s)`` per output token: a decode step one sequence fuller than now, plus the
  same slowdown of each of the ``D(r)`` requests decoding there.  In a closed
  loop a client's next request waits for this one's last token, so decode
  time, not TTFT, sets throughput; where clients are skewed between regions,
  batches are too (Figure 10's setting, 120/40/40 clients on 3/3/3 replicas:
  ~40 running per US replica, ~13 abroad, TTFT still short), and without this
  term the policy forwarded 0.6 % of requests.  It enters only where a peer is
  an option, as the region's mean over its replicas times the predicted
  output, added to every local option and set against the peer's own mean
  (``decode_prices``): within a region harm and admission already spread the
  decoders, and pricing each replica's own batch there moved TTFT for little
  (Azure conversations, 300 s: TTFT p90 1.17 to 1.98 s).  Weighted by
  ``reuse`` (below): decode time delays the requests that wait on this one's
  reply, which is what a later request extending it means; where prompts are
  unique (an open-loop trace) it only traded TTFT for end-to-end time (Azure,
  300 s: 15.6 % forwarded against 7.8 %, TTFT p90 1.30 s against 1.17 s,
  goodput 4.20 against 4.21).  ``decode_weight`` 0 prices TTFT alone.
* ``miss``: where a peer is an option, an option whose own wait for the first
  token passes ``ttft_slo_s`` (the service's TTFT SLO, 2 s by default; the
  simulator's ``--ttft-slo``) costs one request lifetime more, ``life = out(r) x
  itl(r)``, the mean over this region's replicas.  At home that wait is
  ``ttft(r) + slot(r) + pressure(r)`` at the chosen replica (for waiting, at the
  replica waited for, with the prefill queued ahead here); abroad it is ``rtt(g) +
  estimate(g)`` plus the wait in its queue, one step and ``U(g)`` at this region's
  mean rate.  The other terms are seconds of delay, and a second past the SLO
  weighs no more than one before it; what a client is served in time is goodput.
  In a closed loop a client's requests follow one another, so a second of anyone's
  delay costs about ``1 / life`` of a request and a miss a whole one: the lifetime
  is the exchange rate.  Without it an overloaded region kept its new trees home,
  where their first tokens waited seconds, because a peer whose TTFT was short
  charged more in harm, displacement and locality (mixed ToT on vLLM's engines,
  seed 1 over 10 s: us-east's TTFT p50 4.58 s against 0.24-0.26 s in the other
  regions, nothing forwarded; with it, seeds 1-3, 3.6-7.1 % forwarded and TTFT
  p90 5.26-5.67 s against 6.22-6.74 s, goodput a little higher; docs/results.md,
  *A miss is priced where a peer is an option*).  Twice the lifetime forwarded
  8.2 % on seed 1 and served less in time (goodput 79.15 against 84.50), half of
  it forwarded nothing.  Only for a prompt home holds part of: one nobody here
  holds is the document case, which the locality and displacement terms price,
  and a miss there sent documents out of the caches that serve them (Mooncake on
  H100s, 300 s: hit/bound 0.99 to 0.92 for 0.1 % more goodput).  Weighting the
  miss by ``reuse`` instead, as the decode terms are, kept the documents home and
  lost the gain: at 0.95 of a lifetime mixed ToT forwarded 3.1 % against 7.1 % on
  seed 2 (TTFT p90 6.31 s against 5.31 s).  Only where a peer is an option, as
  the decode terms: a replica's price inside a region grows smoothly with its
  queue, which the floors of the walk over cold replicas are built on
  (``meridian_book``), and a price that jumps at the SLO would loosen them; a
  miss between local replicas is not priced, and not measured.  ``ttft_slo_s`` 0
  prices no miss.

Admission (SP-P's rule, "do not pile onto an engine with a waiting queue", in
tokens): ``r`` admits while ``Q(r) < admission_tokens``; by default what the
engine prefills in ``wait_limit_s`` at ``prefill_s_per_token``
(``MeridianConfig.admission_limit``: 472 tokens on an L4, 6,250 on an H100), so an
admitted request waits in the engine's queue about as long as a held-back one may
wait in the balancer's.  It replaces SP-P's one-push-per-probe budget, which made
the replica holding a prefix unavailable right after each push.  A burst shows why
the limit is short (docs/results.md, *Admission in time*): an engine packs every
prompt it holds into its chunked-prefill steps, so 20 cold first turns sent at
once see their first tokens in groups, at the end of long steps that prefill many
of them; held here, they reach the engine a few at a time and the first ones
answer in a fraction of that.
Two chunked-prefill steps (4,096 tokens, the earlier default) let 12 of the 240
opening turns of the conversations preset meet a 2 s TTFT SLO; this limit 156.
The first token that brings ``Q(r)`` back under the limit wakes the queue
(``observe_first_token`` returns True), so a request held for ``r`` goes at once.
The limit assumes an engine that serves its queue first come, first served
(vLLM).  Engines that serve the longest cached prefix first (SGLang's default;
``engine_queue="lpm"``) hold nothing back for a replica that caches more than
``affinity_tokens`` of the prompt (``_served_by_prefix``): its engine serves the
request ahead of colder ones as soon as it has room, where the balancer's queue
would send it in arrival order, after its history may have been evicted
(docs/results.md, *On SGLang's engines*: small-KV conversations on such engines,
seeds 1-3 started over 10 s, goodput 36.68 held as for vLLM against 43.04, where
SGLang's tree serves 41.11).
vLLM orders its queue by request priority when started with
``--scheduling-policy priority`` (``engine_queue="priority"``): lower values
first, arrival order among equals, and under KV pressure it preempts the running
request with the highest (priority, arrival time), not the newest.  Such engines
are told which requests are cold copies into a full cache (``engine_priority``):
a request whose replica caches no more than ``affinity_tokens`` of its prompt and
whose KV look-ahead has no room for it (``_fits``) carries ``COLD_COPY_PRIORITY``
(1), every other ``DEFAULT_PRIORITY`` (0), in ``Choice.priority``, which the
drivers put in the request's body.  Where the KV cache thrashes, a turn finds its
history cached only if its engine starts it soon after the previous turn freed
it (ShareGPT on 8k-token caches: 64-69 % of the prompt cached for turns started
within 0.5 s of their previous turn's finish, under 2 % for those started 2 s or
more later), and first come, first served starts it behind cold prompts, which
lose nothing by waiting.  Where the cache has room, nothing is lost to the order,
and a cold prompt there keeps its place: marking every cold prompt 1 served mixed
ToT 1.3 % less over three seeds (its new trees' roots waited behind their
siblings) and ShareGPT on small caches 3.7 % more.  The balancer's own queue cannot
do this: holding cold prompts there longer moved the hit rate from 12.3 to
13.4-14.0 % and goodput not at all, because the turns waited in the engines'
queues (docs/results.md, *Cached turns first: vLLM's priority scheduling*).
The price is the cold prompts' tail: vLLM's priority queue does not age, and
under overload a cold copy waits while cached turns keep coming (ShareGPT on
8k-token caches: TTFT p99 41 s against 18 s, as on SGLang's longest-prefix
engines, 44 s).
Admission and the balancer's queue are as for first come, first served: treating
such engines as reordering (``engines_reorder``, as for "lpm") served mixed ToT
8 % less with the full-cache rule (4 % with every cold prompt marked).

Waiting for a held-back replica ``h``: ``wait(h) = cost(h) + queued_ahead *
mean uncached prompt * p(h) / replicas``.  ``cost(h)`` already counts all of
``Q(h)``: time spent here until ``h`` admits is time the engine would have
queued the prompt anyway, so what waiting adds is the requests queued ahead of
it here, spread over the region's replicas.  It still pays off when ``h``
holds the prefix (its ``U(h)`` is small).

Never dropping what others serve: a request that has waited ``wait_limit_s``
in the regional queue (for a replica it chose, or because no replica admitted)
has the admission limit waived (``waives_admission``): every healthy replica
that holds its prefix or has KV room for it (prefix affinity, below) is an
option again and the cheapest takes it, as blind pushing would have.  So
the balancer holds a request back at most about that long plus one probe
interval, never until a queue deadline that a blindly pushing least-load
balancer would have served within.  ``wait_limit_s`` is one probe interval
(0.25 s, production's): waiting is worth it for the late binding it buys
until the next probe says where room is; a longer hold only moved the
engine's queue into the balancer (ToT, 60 virtual s: TTFT p90 1.16 s at a 1 s
limit, 0.44 s at 0.25 s, the same throughput).

Prefix affinity: until a request has waited ``wait_limit_s``, a local replica
that lacks more than ``affinity_tokens`` (256) of what the best local holder of
its prompt caches is an option only by waiting (it joins the held-back ones).
The prices above are of the present; a cold copy of a shared prefix also costs
the future: it pins that prefix's KV on a second replica for as long as the
prefix stays in use there, and every later turn follows it.  Where KV is
scarce that is what caps throughput (8k-token caches, 2k-token system prompts:
at the cold start, with nothing decoding anywhere, a turn priced 1.28 s at the
holder's queue against 1.19 s on an idle replica spread each system prompt
over two replicas for the whole run; 60 virtual s: 15.9 to 18.0 req/s with
affinity, SGLang's tree 18.9).  After ``wait_limit_s`` the admission limit is
waived and a replica lacking the prefix is an option again only if the copy
fits its KV look-ahead (``K(r) + U(r) + min(pred, L) <= kv_capacity_tokens``:
it evicts nothing); the holders always are.  A copy into a full cache evicts
what that replica's own requests will reuse, the cost no price of the present
sees; in the thrashing regime every cache is full, and letting the cheapest
replica take a waived turn put a second system prompt on 1 to 4 of each
region's replicas, a quarter of their 8k tokens (120 virtual s, seed 1:
goodput 2.07 to 2.43; TTFT alone decided those copies, on learned prefill
rates that the KV-bound queue had inflated 3 to 6x).  Nor may the copy exceed
``max_copy_share`` (a quarter) of a replica's cache, room or not: the look-ahead
sees only the present, and a copy that large pins its share for every later
turn of the programs that follow it (2k-token system prompts leaked past the
wait limit into 8k-token caches with room at that moment, and the replicas
that took them thrashed: small-KV conversations over seeds 1-6, goodput 23.52
to 28.88 against SGLang's tree 28.07; no other preset changed on seed 1).
Where KV has room (L4 caches, short ToT prompts) a busy holder is relieved as
before.

Peers get the same rule, since a forward copies the whole prompt cold: a
request whose prefix a local replica caches (more than ``affinity_tokens``)
is forwarded only after ``wait_limit_s``, and only when no local replica's KV
look-ahead has room for it.  At the cold start every region opens its
conversations at once, the peers' heartbeats say 0 s, and 1 % of the turns
went abroad, each pinning a foreign 2k-token system prompt in a peer's 8k
cache (goodput 2.43 to 3.33).  A prompt nothing here caches is forwarded on
price alone, as before, and so is one to a peer holding at least as much of it
as the best local holder (a program that went there earlier: no cold copy).
So is a chat's first turn (no assistant or tool message) whose prompt is at most
``max_copy_share`` of a cache: what home caches of it (a shared system prompt)
was cached for other conversations, so the gate protects no program of its own,
and the copy abroad pins little.  Without it, a region offloaded conversations
only through moments of KV pressure, and whether one came was luck: Figure 10
cross-region at 9 replicas forwarded 14-15 % on seeds 1 and 3 and 0.2 % on seed
2 (30.25, 28.62, 29.90 req/s; with it 30.51, 29.93, 30.23, forwarding 20-22 %).
The 2k-token system prompts of 8k-token caches stay over the share.
So the balancer never holds a request past the wait limit for affinity: a
holder is always an option.
Opening the gate for a request whose home option would miss the SLO (its own
wait, as ``miss`` reads it) forwarded more branches cold and served fewer in
time (mixed ToT, seed 1: 84.50 to 83.92 on vLLM's engines over 10 s, 78.97 to
75.52 at once; docs/results.md, *Where mixed ToT's misses are served*).

Held-back peers: a peer that serves the model but reports no replica admitting
(or a queue past τ) is no option under Algorithm 1, and a forward there waits in
that region's queue.  It is an option here for a request whose program lives
there, where the peer holds more of the prompt than any local replica
(``_living_there``); anywhere else it would be a cold copy into a full region.
Without it a tree forwarded at its root came home for its branches whenever the
peer was full, and each such branch copied the tree cold into a local replica
(mixed ToT, 60 virtual s: 86 of the 133 decisions in us-east whose prompt a peer
held more of than home found no available peer).  Its price adds the wait in its
queue: the requests it reports queued there, each taken as a typical one here
(the peer reports their count, not their work), spread over its healthy
replicas at this region's mean rate, as ``wait(h)`` prices the requests queued
ahead here.  With both (120 virtual s, seeds 1-3): ToT goodput 223.06 to 225.17,
mixed ToT 183.27 to 187.12 with TTFT p90 9.00-9.70 s to 7.47-8.44 s, Figure 10
cross-region at 9 replicas 87.68 to 88.64 req/s; without the queue's wait, mixed
ToT's p90 fell only to 8.34-9.34 s.

Peer ``g``: priced with the same terms as a replica, seen from here:

* ``rtt(g) + estimate(g) + step_s + U(g) * price(g) + out * decode(g)``, plus
  ``miss`` where its own wait for the first token passes the SLO:
  ``rtt(g)`` is the configured round trip, ``estimate(g)`` the seconds that
  region reports for itself in its availability heartbeat
  (``region_estimate``: its queue and KV pressure);
* ``U(g)``: this prompt's tokens that region lacks.  A peer says what its
  replicas hold in its heartbeat (``prefixes``: a sampled digest of its own
  radix tree, ``core.prefix_digest``), so a document its own clients
  put there is priced as cached, and one its caches evicted as cold.  What
  this balancer forwarded there since that report counts as held too (the
  peer as a tenant of the radix tree, cleared at each new report: the report
  could not know it yet), whichever says more.  A peer that reports no digest
  (an older balancer) is priced by every forward still in the tree, as
  SkyLB's snapshot trie does; a prompt never sent there counts whole.  Trusting
  the forwards alone credited peers with what their caches had dropped: an 8k
  cache evicts a forwarded 2k-token system prompt long before the guess does
  (small-KV conversations, seed 2: goodput 2.75 against 3.36 with the
  digest), and missed the reuse between regions entirely (Mooncake on H100s:
  hit rate 5.3 % against 10.9 %, 0.43 against 0.88 of the pooled bound);
* ``price(g)`` and ``decode(g)``: seconds per uncached prompt token there
  (prefill plus harm to the requests decoding there) and per output token, as
  the peer reports them (``region_prices``, the heartbeat's ``prefill_prices``
  and ``decode_prices``), weighted by ``reuse``: ``price(g) = P_here + reuse *
  (P_g - P_here)`` with ``P_here = p + harm_weight * D * p0`` at this
  region's mean rate and decoders, and ``reuse * decode_g``.  What the peer's
  own decoders change delays the requests waiting on this reply; for unique
  prompts it only moved TTFT (Azure, 300 s, the peer's prices unweighted:
  9.3 % forwarded, TTFT p90 1.25 s, against 7.8 % and 1.17 s), and there the
  peer is priced as before.  A peer that reports none (an older balancer) is
  priced with ``P_here`` and this region's mean ``decode``.  Pricing the
  peer's prefill with this region's decoders made a busy region's forward look
  as harmful as a local one (Figure 10 at 6 replicas: 19.22 against 20.84
  req/s);
* the locality it loses here, unless the peer holds more of the prompt than
  home (``U(g) < U_home``, a program already living there): the later turns
  or branches of this request's program still arrive here, where the replica
  that would have served it now lacks its new tokens and its reply.  Each of
  them recomputes ``U_home + predicted output`` tokens (``U_home``: this
  prompt's uncached tokens at the local replica holding its longest prefix),
  priced like any prefill, ``p + harm_weight * D * p0`` per token, times
  ``reuse``: how likely a later
  request is to extend this one, learned as the share of each routed prompt
  that was already cached (EWMA), so a workload of unique prompts pays nothing
  for forwarding.  Where the peer holds more, forwarding leaves nothing behind.
  At equal holdings it is charged only where neither holds any of the prompt.
  Where both hold the same part of it (a system prompt, a tree's question),
  what the forward leaves is this request's own tokens and reply, and its
  program's later requests follow it abroad (the peer's tenancy of the tree,
  then its digest), paying the round trip and the peer's prices in their own
  decisions; charging it here too kept an overloaded region's new trees at
  home (ToT in the thrashing regime, 120 s, seeds 1-3: goodput 66.96, 64.89,
  67.04 charged against 67.56, 70.06, 70.01 not, TTFT p90 0.84-1.09 s against
  0.58-0.78 s).  A prompt nobody holds any of may be a document that other
  sessions here send again, and is charged (Mooncake on H100s: hit/bound 0.88
  uncharged against 0.98).  Equal holdings were once charged throughout,
  because a new conversation's first turn, whose system prompt both hold,
  moved on noise (symmetric conversations, 120 s: 13.7 % forwarded); prefix
  affinity and ``_may_forward`` keep it home now (0.0 % forwarded either way,
  seeds 1-3);
* what the copy displaces there: ``displace_weight * reuse * U(g) *
  price(g)``.  The peer's caches are full in steady state (an LRU keeps
  everything until it needs the room), so the ``U(g)`` tokens copied there
  push out as many of what its own clients put there, reused about as often
  as here (``reuse``): each is one they will prefill again.  The peer's own
  prefixes are the mirror image of the locality lost here, and a prompt the
  peer holds displaces only what it lacks.  Without it a cold prompt went
  abroad on a small price difference and pushed the peer's documents out
  (Mooncake on H100s, 300 s: hit rate 10.9 % against 12.1 %, 0.88 against
  0.98 of the pooled bound; ToT on 8k-token caches, seeds 1-3: goodput
  194.05 against 198.89, hit/bound 0.946-0.949 against 0.949-0.954); it
  forwards less where a busy region relieves itself by sending whole
  conversations to idle ones (Figure 10 at 6 replicas: 19.95 against 19.38
  req/s).  Not charged where the peer holds more of the prompt than home
  (``U(g) < U_home``: the program lives there): serving the request here is
  then the larger copy, and it displaces as many of this region's own tokens,
  which no local price charges either.  Charged there, a tree's first branch
  after its root went abroad came home on that charge alone, and its siblings
  and children followed it (ToT on L4s, 120 s, seed 1: 628 of the 1,162 later
  requests of trees whose root went abroad were served at home; ToT goodput
  over seeds 1-3 226.23 with the charge against 228.11 without it, mixed ToT
  199.83 against 189.12: its peers are saturated too).

A region's ``region_estimate`` is what a typical request (mean prompt, mean
output) would wait at its best healthy replica before its own prefill:
``Q(r) * p(r) + pressure(r)``, the least over them, so a peer whose KV
look-ahead is full does not look idle.  (The mean over them forwarded less
where forwarding relieved bursts: Azure, 300 s, 2.0 % forwarded, TTFT p90
1.24 s against 1.17 s.)  Its ``region_prices`` are ``p(r) + harm_weight * D(r) *
p0`` and ``decode(r)``, each the mean over its healthy replicas
(``_mean_prices``), so a peer whose replicas run large batches does not look
idle.

Decision cost: a decision prices the replicas holding part of the prompt,
then walks the cold ones from ``core.cost_floors``: orders of the
replicas, kept as ledgers, rates and probes change, in which every replica not
yet priced has a known lower bound, and stops once that bound cannot beat the
best found (``ReplicaBook.cheapest``, ``meridian_book``).  When the prompt and
its look-ahead fit in the KV capacity the order is a floor (``Q(r) * p(r)`` plus
the pressure of the ledger alone); when they do not, every replica overflows
and its pressure is linear in the request's excess with per-replica terms that
depend on the probed ``kv_usage``, so two orders are walked in turn (Fagin's threshold algorithm).
A decision therefore prices the holders and a few cold replicas, not all of
them (``manage.py bench routing``; ``docs/results.md``, decision cost).

Ties go to a replica before waiting before a peer; among holders to
``load_key`` order and among cold replicas to the walk's (replicas in the same
state: the lower id), so decisions are deterministic.

Modules: this one decides (the options, affinity, the forwarding rule, what is
learned); ``meridian_terms`` holds the settings, each replica's model and the
arithmetic of one replica's price; ``meridian_book`` files the replicas by the
floors of their cost and walks them; ``meridian_peers`` knows what each peer
holds and prices a forward.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping, Sequence
from operator import attrgetter

from core.event_keys import CacheEventSink
from core.policies.meridian_book import ReplicaBook
from core.policies.meridian_peers import ForwardTerms, PeerHoldings, best_peer
from core.policies.meridian_terms import (
    COLD_COPY_PRIORITY,
    DEFAULT_PRIORITY,
    InFlight,
    MeridianConfig,
    ReplicaModel,
    clamp,
    decode_cost_s,
    ewma,
    harm_s,
    own_wait_s,
    pressure_s,
    replica_cost,
    rtt_s,
)
from core.policy import Choice, Option, PolicyBase
from core.prefix_digest import PrefixDigest, digest_of
from core.radix_tree import RadixTree
from core.types import RequestDescriptor, TargetState

__all__ = ["MeridianConfig", "MeridianPolicy"]

_TARGET_ID = attrgetter("target_id")


class TreeEvictions:
    """The cost model's radix tree as a sink of the engines' KV events
    (``MeridianPolicy.engine_evicted``; a cleared cache drops the replica).  Stores
    teach nothing new: the tree learned the path when the prompt was routed, and the
    policy re-inserts it at its first token."""

    def __init__(self, policy: MeridianPolicy) -> None:
        self.policy = policy

    def apply_stored(self, replica: str, blocks: Sequence[int]) -> None:
        self.policy.follow(replica)

    def apply_removed(self, replica: str, blocks: Sequence[int]) -> None:
        self.policy.follow(replica)
        self.policy.engine_evicted(replica, blocks)

    def clear(self, replica: str) -> None:
        self.policy.tree.remove_tenant(replica)


class MeridianPolicy(PolicyBase):
    name = "meridian"

    def __init__(self, config: MeridianConfig | None = None) -> None:
        self.config = config or MeridianConfig()
        self.admission_limit = self.config.admission_limit()
        events = self.config.tree_from_kv_events
        self.tree = RadixTree(self.config.max_blocks_per_target, index_blocks=events)
        # Where the engines' KV events go (``core.event_keys.apply_events``); None: unused.
        self.kv_sink: CacheEventSink | None = TreeEvictions(self) if events else None
        # Replicas whose engines' events the tree follows (``follow``).
        self.following: set[str] = set()
        # Every replica's model, filed by the floors of its cost (the walk's index).
        self.book = ReplicaBook(self.config)
        self.peers = PeerHoldings(self.tree, self.config.block_tokens)
        self.mean_output = float(self.config.default_output_tokens)
        self.mean_uncached = 0.0
        self.mean_prompt = 0.0
        # Share of a routed prompt already cached: how likely a request extends an earlier one.
        self.reuse = 0.0
        self.decoding_total = 0
        # The latest digest for peers, with the tree version and replicas it is of.
        self._digest: tuple[tuple[int, tuple[str, ...]], PrefixDigest] | None = None

    @property
    def replicas(self) -> dict[str, ReplicaModel]:
        """What the cost model knows of each replica, by id."""
        return self.book.replicas

    # -- the Policy interface -----------------------------------------------------------

    def select(
        self, request: RequestDescriptor, candidates: Sequence[TargetState]
    ) -> TargetState | None:
        """The cheapest of ``candidates`` (no peers, no waiting)."""
        choice = self.choose(request, candidates, (), ())
        return choice.target

    def on_complete(self, request: RequestDescriptor, target: TargetState, ok: bool) -> None:
        model = self.replicas.get(target.target_id)
        entry = model.inflight.pop(request.request_id, None) if model else None
        if model is None or entry is None:
            return
        model.kv_tokens -= entry.kv_tokens
        if entry.prefilled:
            model.decoding -= 1
            self.decoding_total -= 1
        else:
            model.queued_prefill -= entry.uncached
        self.book.reindex(target.target_id, model)

    def on_targets_changed(self, target_ids: Sequence[str]) -> None:
        keep = set(target_ids)
        self.tree.retain_tenants(keep | self.peers.peer_ids)
        self.following &= keep
        self.book.retain(keep)
        self.decoding_total = sum(m.decoding for m in self.replicas.values())
        for target_id in target_ids:
            self.book.model(target_id)

    def follow(self, target_id: str) -> None:
        """``target_id``'s engine publishes KV events: the tree's bound for it only caps
        memory from now on (twice its cache), since its events say what it evicts."""
        if target_id not in self.following:
            self.following.add(target_id)
            self.tree.set_bound(target_id, 2 * self.config.max_blocks_per_target)

    def engine_evicted(self, target_id: str, blocks: Sequence[int]) -> None:
        """``target_id``'s engine reported ``blocks`` evicted: the tree cuts its hold
        there.  The event may describe an eviction from before a prompt was routed
        there, so the prompts it has not prefilled yet keep their paths: the engine
        stores those blocks when it prefills them."""
        if not self.tree.release(target_id, blocks):
            return
        model = self.replicas.get(target_id)
        for entry in model.inflight.values() if model else ():
            if not entry.prefilled:
                self.tree.insert(entry.blocks, target_id)

    def learn_route(self, blocks: Sequence[int], target_id: str) -> None:
        """A sibling process routed ``blocks`` to ``target_id``: the radix tree learns
        where the prefix lives; the queued work stays that process's own ledger."""
        self.tree.insert(blocks, target_id)

    # -- the CostModel interface --------------------------------------------------------

    def choose(
        self,
        request: RequestDescriptor,
        available: Sequence[TargetState],
        held_back: Sequence[TargetState],
        peers: Sequence[TargetState],
        *,
        held_back_peers: Sequence[TargetState] = (),
        waited_s: float = 0.0,
        queued_ahead: int = 0,
        peer_prefixes: Mapping[str, PrefixDigest] | None = None,
    ) -> Choice:
        waived = self.waives_admission(waited_s)
        if held_back and waived:
            # Waited long enough: held back or not, every replica is an option now.
            available, held_back = [*available, *held_back], ()
        # Built in C (dict over zip): at 512 targets a comprehension is a third of a decision.
        admitting = dict(zip(map(_TARGET_ID, available), available))
        waiting = dict(zip(map(_TARGET_ID, held_back), held_back))
        local = admitting.keys() | waiting.keys() if waiting else admitting.keys()
        uncached = self.uncached_by_target(request, local)
        if waiting and self.engines_reorder:
            admitting, waiting = self._served_by_prefix(request, admitting, waiting, uncached)
        everywhere = admitting
        if uncached:
            admitting, waiting = self._with_affinity(request, admitting, waiting, uncached, waived)
        at_peers: Mapping[str, int] = {}
        queued_s: dict[str, float] = {}
        reachable = [*peers, *held_back_peers] if held_back_peers else peers
        told = self.peers.usable(peer_prefixes) if reachable and peer_prefixes else {}
        if reachable:
            at_peers = self.peers.uncached(request, reachable, told)
            if held_back_peers:
                living = self._living_there(request, held_back_peers, uncached, at_peers)
                queued_s = {p.target_id: self._peer_queue_s(p) for p in living}
                peers = [*peers, *living]
        if peers and not self._may_forward(request, uncached, everywhere, waived):
            # A forward there is no cold copy where the program already lives.
            home = min(uncached.values())
            prompt = request.prompt_tokens
            peers = [p for p in peers if at_peers.get(p.target_id, prompt) <= home]
        # Decode terms only where a peer is an option: see ``decode`` above.
        decode_here = self._decode_here(request) if peers else 0.0
        best = self._best_replica(request, admitting, uncached, decode_here)
        # The replica the home option's first token waits on, and the prefill queued
        # ahead of it in the balancer's queue (what ``miss`` reads).
        home_target, ahead_tokens = best.target, 0.0
        if waiting:
            wait, wait_for, wait_ahead = self._best_wait(
                request, waiting, uncached, queued_ahead, len(local), decode_here
            )
            if wait.cost_s < best.cost_s:
                best, home_target, ahead_tokens = wait, wait_for, wait_ahead
        if peers:
            # What a forward leaves behind: the best local match it does not extend.
            # With no local replica at all there is no locality to lose (None).
            home_uncached = min(uncached.values(), default=request.prompt_tokens) if local else None
            rate, lifetime = self._mean_rate_and_lifetime()
            # A miss is priced only for a prompt home holds part of (the document case,
            # a prompt nobody here holds, is left to the locality it would take away).
            held_here = home_uncached is not None and home_uncached < request.prompt_tokens
            miss_price = lifetime if held_here else 0.0
            peer = self._best_peer(
                request, peers, home_uncached, at_peers, queued_s, rate, miss_price
            )
            miss = self._home_miss_s(request, home_target, uncached, ahead_tokens, miss_price)
            if peer.cost_s < best.cost_s + miss:
                best = peer
        if best.option is Option.REPLICA and best.target is not None:
            chosen = best.target
            tokens = uncached.get(chosen.target_id, request.prompt_tokens)
            if self.config.engine_queue == "priority":
                # Read before the request joins the replica's look-ahead.
                priority = self.engine_priority(request, chosen, tokens)
                best = Choice(best.option, chosen, best.cost_s, priority)
            self._record(request, chosen, tokens)
        elif best.option is Option.PEER and best.target is not None:
            self.peers.forwarded(request, best.target.target_id)
        return best

    def _with_affinity(
        self,
        request: RequestDescriptor,
        admitting: dict[str, TargetState],
        waiting: dict[str, TargetState],
        uncached: dict[str, int],
        waived: bool,
    ) -> tuple[dict[str, TargetState], dict[str, TargetState]]:
        """Prefix affinity.  Before the wait limit, admitting replicas that lack more
        than ``affinity_tokens`` of what the best local holder caches move to the
        held-back ones (reached only by waiting); after it, such a replica stays an
        option only if the copy fits its KV look-ahead (it evicts nothing) and is at
        most ``max_copy_share`` of a cache (it pins no more for the later turns)."""
        limit = min(uncached.values()) + self.config.affinity_tokens
        prompt = request.prompt_tokens
        if prompt <= limit:
            return admitting, waiting  # the best holder saves no more than the slack
        # Over the holders only (a decision must not walk every replica in Python).
        near = {t: admitting[t] for t, u in uncached.items() if u <= limit and t in admitting}
        if len(near) == len(admitting):
            return admitting, waiting
        if waived:
            if not near:
                return admitting, waiting  # no healthy holder: every replica, as blind pushing
            # After the wait limit (every replica is admitting then, nothing waits).
            decode = self._decode_tokens(request)
            roomy = {
                t: target
                for t, target in admitting.items()
                if t not in near
                and self._pins_little(copy := uncached.get(t, prompt))
                and self._fits(target, copy + decode)
            }
            return {**near, **roomy}, waiting
        # Every admitting replica joins the held-back ones, the near ones included: as
        # a wait each costs more than itself as a replica, so it never wins as one.
        return near, {**waiting, **admitting}

    def _served_by_prefix(
        self,
        request: RequestDescriptor,
        admitting: dict[str, TargetState],
        waiting: dict[str, TargetState],
        uncached: Mapping[str, int],
    ) -> tuple[dict[str, TargetState], dict[str, TargetState]]:
        """Engines that serve the longest cached prefix first (``engine_queue`` "lpm"):
        a held-back replica that caches more than ``affinity_tokens`` of the prompt
        admits the request anyway.  Its engine serves it ahead of every colder
        waiting request as soon as it has room; held here, it would go in arrival
        order, after its history may have been evicted.  A prompt the replica
        caches less of is held as before: the engine would queue it behind the
        warmer ones, and here it may still go to whichever replica frees first."""
        prompt = request.prompt_tokens
        served = {
            t: target
            for t, target in waiting.items()
            if self._caches_enough(prompt, uncached.get(t, prompt))
        }
        if not served:
            return admitting, waiting
        held = {t: target for t, target in waiting.items() if t not in served}
        return {**admitting, **served}, held

    @staticmethod
    def _living_there(
        request: RequestDescriptor,
        held_back_peers: Sequence[TargetState],
        uncached: Mapping[str, int],
        at_peers: Mapping[str, int],
    ) -> list[TargetState]:
        """The held-back peers that hold more of the prompt than any local replica:
        the request's program lives there, and following it (waiting in that
        region's queue) is an option; anywhere else it would be a cold copy."""
        home = min(uncached.values(), default=request.prompt_tokens)
        prompt = request.prompt_tokens
        return [p for p in held_back_peers if at_peers.get(p.target_id, prompt) < home]

    def _may_forward(
        self,
        request: RequestDescriptor,
        uncached: Mapping[str, int],
        local: Mapping[str, TargetState],
        waived: bool,
    ) -> bool:
        """Whether peers are options: a forward is a cold copy of the whole prompt, so
        a request whose prefix a local replica caches (more than ``affinity_tokens``)
        is forwarded only after the wait limit, and only when no local replica's KV
        look-ahead has room for it (the region is thrashing, not merely busy).  A
        chat's first turn is priced abroad at once when its copy pins little: none of
        what home caches of it is its own."""
        prompt = request.prompt_tokens
        if not uncached or min(uncached.values()) + self.config.affinity_tokens >= prompt:
            return True
        if request.first_turn and self._pins_little(prompt):
            return True  # what home holds of it was cached for other programs
        if not waived:
            return False
        decode = self._decode_tokens(request)
        return not any(
            self._fits(target, uncached.get(t, prompt) + decode) for t, target in local.items()
        )

    def _pins_little(self, copy_tokens: int) -> bool:
        """Whether a cold copy of ``copy_tokens`` stays within ``max_copy_share`` of a
        replica's KV cache: the share it pins for the later requests that follow it."""
        return copy_tokens <= self.config.max_copy_share * self.config.kv_capacity_tokens

    def _fits(self, target: TargetState, kv_tokens: int) -> bool:
        """Whether ``kv_tokens`` more fit ``target``'s KV look-ahead with no pressure."""
        return pressure_s(self.config, self.book.model(target.target_id), kv_tokens) == 0.0

    @property
    def engines_reorder(self) -> bool:
        """Whether the engines serve their queues longest cached prefix first."""
        return self.config.engine_queue == "lpm"

    def served_ahead(self, request: RequestDescriptor) -> bool:
        """Whether a local replica's engine would serve ``request`` ahead of colder
        waiting ones: it orders its queue by cached prefix and caches more than
        ``affinity_tokens`` of the prompt, the test of ``_served_by_prefix``.  The
        dispatch core then lets the request past the balancer's first-come queue
        to be priced, held-back holders included.  One walk of the radix tree."""
        blocks = request.block_hashes
        if not self.engines_reorder or not blocks:
            return False
        depth, _ = self.tree.match(blocks, self.replicas.keys())
        prompt = request.prompt_tokens
        return self._caches_enough(prompt, max(0, prompt - depth * self.config.block_tokens))

    def engine_priority(
        self, request: RequestDescriptor, target: TargetState, uncached: int
    ) -> int:
        """The priority ``request`` carries to ``target``'s engine, if it schedules by
        priority, before it is recorded there: a cold copy (the replica caches no more
        than ``affinity_tokens`` of the prompt, ``_caches_enough``) into a KV cache
        whose look-ahead has no room for it yields to everything else."""
        if self._caches_enough(request.prompt_tokens, uncached):
            return DEFAULT_PRIORITY
        if self._fits(target, uncached + self._decode_tokens(request)):
            return DEFAULT_PRIORITY
        return COLD_COPY_PRIORITY

    def _caches_enough(self, prompt: int, uncached: int) -> bool:
        """Whether a replica lacking ``uncached`` tokens of a ``prompt``-token prompt
        caches more than ``affinity_tokens`` of it: what a longest-prefix engine serves
        ahead (``served_ahead``, ``_served_by_prefix``)."""
        return prompt - uncached > self.config.affinity_tokens

    def admits(self, target: TargetState) -> bool:
        model = self.replicas.get(target.target_id)
        return model is None or model.queued_prefill < self.admission_limit

    def waives_admission(self, waited_s: float) -> bool:
        return waited_s >= self.config.wait_limit_s

    def region_estimate(self, targets: Sequence[TargetState]) -> float:
        typical = round(self.mean_uncached) + min(
            round(self.mean_output), self.config.lookahead_tokens
        )
        return min(
            (
                self._queue_s(t.target_id)
                + pressure_s(self.config, self.book.model(t.target_id), typical)
                for t in targets
                if t.healthy
            ),
            default=math.inf,
        )

    def region_prices(self, targets: Sequence[TargetState]) -> tuple[float, float]:
        return self._mean_prices(targets)

    def region_digest(self, targets: Sequence[TargetState]) -> PrefixDigest:
        """What the healthy ``targets`` hold, as the radix tree knows it, sampled for
        peers (``core.prefix_digest``); rebuilt only when the tree or the
        replicas changed since the last report."""
        ids = tuple(sorted(t.target_id for t in targets if t.healthy))
        key = (self.tree.version, ids)
        if self._digest is not None and self._digest[0] == key:
            return self._digest[1]
        cfg = self.config
        digest = digest_of(
            self.tree,
            frozenset(ids),
            block_tokens=cfg.block_tokens,
            min_stride=cfg.digest_min_stride,
            max_hashes=cfg.digest_max_hashes,
        )
        self._digest = (key, digest)
        return digest

    def _mean_prices(self, targets: Sequence[TargetState]) -> tuple[float, float]:
        """The prices of one prompt token (prefill plus harm to the decoders) and one
        output token (the decode terms) here, averaged over the healthy replicas: a
        forward lands wherever the peer's balancer puts it on arrival, a poll interval
        and a round trip after the report, and every region reads the same report.
        Reporting the least-loaded replica's made regions under the same load forward
        to each other (Azure conversations, 300 s, with decode terms on every option:
        56 % of requests forwarded reporting the replica least for the sum, 13.6 %
        reporting the mean)."""
        cfg = self.config
        prefill = decode = 0.0
        healthy = 0
        for t in targets:
            if not t.healthy:
                continue
            model = self.book.model(t.target_id)
            healthy += 1
            prefill += model.prefill_s_per_token + harm_s(cfg, 1, model.decoding)
            decode += decode_cost_s(cfg, model.decoding, 1)
        if not healthy:
            return math.inf, math.inf
        return prefill / healthy, decode / healthy

    def observe_first_token(
        self, request: RequestDescriptor, target_id: str, ttft_s: float
    ) -> bool:
        model = self.replicas.get(target_id)
        entry = model.inflight.get(request.request_id) if model else None
        if model is None or entry is None or entry.prefilled:
            return False
        entry.prefilled = True
        # The engine stored the prompt's blocks now: the tree dates them by use, as
        # the engine's LRU does, not only by when they were routed.
        self.tree.insert(request.block_hashes, target_id)
        held_back = model.queued_prefill >= self.admission_limit
        model.queued_prefill -= entry.uncached
        model.decoding += 1
        self.decoding_total += 1
        work = entry.queued_ahead + entry.uncached
        if work >= self.config.min_sample_tokens:
            cfg = self.config
            sample = max(0.0, ttft_s - model.rtt_s - cfg.step_s) / work
            sample = clamp(sample, cfg.prefill_s_per_token / 8, cfg.prefill_s_per_token * 8)
            model.prefill_s_per_token = self._ewma(model.prefill_s_per_token, sample)
            # Off the decision path (a response arrived): a full scan is affordable here.
            self.book.relearn_least_rate()
        self.book.reindex(target_id, model)
        return held_back and model.queued_prefill < self.admission_limit

    def observe_finish(
        self, request: RequestDescriptor, target_id: str, decode_s: float, output_tokens: int
    ) -> None:
        if target_id in self.replicas or target_id in self.peers.peer_ids:  # not one gone
            self.tree.insert(request.block_hashes, target_id)  # freed now: the engine's LRU
        if output_tokens < 1:
            return
        self.mean_output = self._ewma(self.mean_output, float(output_tokens))
        model = self.replicas.get(target_id)
        if model is None:
            return
        model.mean_output = self._ewma(model.mean_output, float(output_tokens))
        if output_tokens >= 2:
            sample = clamp(
                decode_s / (output_tokens - 1), self.config.itl_s / 8, self.config.itl_s * 8
            )
            model.itl_s = self._ewma(model.itl_s, sample)
        self.book.reindex(target_id, model)

    def observe_probe(self, target_id: str, kv_usage: float) -> None:
        """A probe of ``target_id`` read ``kv_usage``.  The cost model prices the KV
        usage it was told here, not ``TargetState.kv_usage``: the walk's floors are
        filed with it (off the decision path), so they hold for every decision."""
        model = self.book.model(target_id)
        if model.kv_usage != kv_usage:
            model.kv_usage = kv_usage
            self.book.reindex(target_id, model)

    # -- pricing ------------------------------------------------------------------------

    def predicted_output(self, request: RequestDescriptor) -> int:
        if request.predicted_output_tokens is not None:
            return max(0, request.predicted_output_tokens)
        guess = round(self.mean_output)
        return min(guess, request.max_tokens) if request.max_tokens is not None else guess

    def uncached_by_target(
        self, request: RequestDescriptor, targets: Collection[str]
    ) -> dict[str, int]:
        """Uncached prompt tokens per target that holds part of the prompt."""
        blocks = request.block_hashes
        if not blocks:
            return {}
        depths = self.tree.match_depths(blocks, targets)
        size, prompt = self.config.block_tokens, request.prompt_tokens
        return {t: max(0, prompt - d * size) for t, d in depths.items()}

    def replica_cost(self, request: RequestDescriptor, target: TargetState, uncached: int) -> float:
        """ttft + harm + pressure of sending ``request`` to ``target`` now."""
        model = self.book.model(target.target_id)
        self.book.sync_rtt(target.target_id, model, rtt_s(self.config, target))
        return replica_cost(self.config, model, uncached, self._decode_tokens(request))

    def _decode_tokens(self, request: RequestDescriptor) -> int:
        """KV tokens the request's decoding adds within the look-ahead."""
        return min(self.predicted_output(request), self.config.lookahead_tokens)

    def _best_replica(
        self,
        request: RequestDescriptor,
        targets: dict[str, TargetState],
        uncached: dict[str, int],
        decode_here: float,
    ) -> Choice:
        best, cost = self._cheapest(request, targets, uncached, 0.0)
        if best is None:
            return Choice(Option.WAIT, None, math.inf)
        return Choice(Option.REPLICA, best, cost + decode_here)

    def _decode_here(self, request: RequestDescriptor) -> float:
        """The request's decode terms in this region, the mean over its replicas (as
        a peer reports its own): what a local option is set against a peer with.
        ``decode`` is linear in ``D``, so its mean is its value at the mean ``D``,
        kept as a running total (no walk over the replicas per decision).  Weighted
        by ``reuse``, as a peer's reported prices are (``meridian_peers``)."""
        cfg = self.config
        running = self._mean_decoding()
        step = cfg.step_s + (running + 1 + cfg.harm_weight * running) * cfg.seq_s
        return self.reuse * cfg.decode_weight * self.predicted_output(request) * step

    def _best_wait(
        self,
        request: RequestDescriptor,
        held_back: dict[str, TargetState],
        uncached: dict[str, int],
        queued_ahead: int,
        replicas: int,
        decode_here: float,
    ) -> tuple[Choice, TargetState | None, float]:
        """Waiting, priced at the held-back replica it is cheapest to wait for; also
        that replica and the prefill tokens queued ahead here."""
        # replica_cost already counts all of Q(h): what waits here for h to admit is
        # prefilled that much later at the engine, not twice.  What waiting adds is
        # the requests queued ahead here, spread over the region's replicas.
        ahead_tokens = queued_ahead * self.mean_uncached / max(1, replicas)
        target, cost = self._cheapest(request, held_back, uncached, ahead_tokens)
        return Choice(Option.WAIT, None, cost + decode_here), target, ahead_tokens

    def _home_miss_s(
        self,
        request: RequestDescriptor,
        home: TargetState | None,
        uncached: Mapping[str, int],
        ahead_tokens: float,
        miss_price: float,
    ) -> float:
        """``miss`` of the home option: ``miss_price`` where its own wait for the
        first token at ``home`` (its replica, or the one it waits for) passes the SLO."""
        slo = self.config.ttft_slo_s
        if slo <= 0 or home is None:
            return 0.0
        model = self.book.model(home.target_id)
        tokens = uncached.get(home.target_id, request.prompt_tokens)
        decode = self._decode_tokens(request)
        wait = own_wait_s(self.config, model, tokens, decode, ahead_tokens)
        return miss_price if wait > slo else 0.0

    def _cheapest(
        self,
        request: RequestDescriptor,
        by_id: dict[str, TargetState],
        uncached: Mapping[str, int],
        extra_tokens: float,
    ) -> tuple[TargetState | None, float]:
        """The cheapest of ``by_id`` for ``request`` (``ReplicaBook.cheapest``)."""
        decode = self._decode_tokens(request)
        return self.book.cheapest(request.prompt_tokens, decode, by_id, uncached, extra_tokens)

    def _best_peer(
        self,
        request: RequestDescriptor,
        peers: Sequence[TargetState],
        home_uncached: int | None,
        at_peers: Mapping[str, int],
        queued_s: Mapping[str, float],
        rate: float,
        miss_price: float,
    ) -> Choice:
        cfg = self.config
        output = self.predicted_output(request)
        terms = ForwardTerms(
            prompt=request.prompt_tokens,
            output=output,
            # Per-token price of prefill anywhere: its own wait plus its harm to decoders.
            per_token=rate + harm_s(cfg, 1, self._mean_decoding()),
            # A peer that reports no prices (an older balancer) is priced as this
            # region: its mean rate and decoders for prefill, its mean decode terms.
            decode_per_token=self._decode_here(request) / max(1, output),
            reuse=self.reuse,
            home_uncached=home_uncached,
            step_s=cfg.step_s,
            displace_weight=cfg.displace_weight,
            rate=rate,
            ttft_slo_s=cfg.ttft_slo_s,
            miss_s=miss_price,
        )
        return best_peer(terms, peers, at_peers, queued_s)

    def _peer_queue_s(self, peer: TargetState) -> float:
        """What a forward waits in a held-back peer's queue: the requests it
        reported queued there, each taken as a typical one here (the peer reports
        their count, not their work), spread over its healthy replicas, at this
        region's mean rate; as ``wait(h)`` prices the requests queued ahead here."""
        replicas = max(1.0, peer.extra.get("healthy_replicas", 1.0))
        return peer.waiting * self.mean_uncached * self._mean_rate() / replicas

    def _mean_decoding(self) -> float:
        return self.decoding_total / len(self.replicas) if self.replicas else 0.0

    def _queue_s(self, target_id: str) -> float:
        model = self.book.model(target_id)
        return model.queued_prefill * model.prefill_s_per_token

    def _mean_rate(self) -> float:
        return self._mean_rate_and_lifetime()[0]

    def _mean_rate_and_lifetime(self) -> tuple[float, float]:
        """This region's mean prefill rate, and its mean request lifetime (``out(r) x
        itl(r)``, what ``miss`` prices), in one pass over the replicas."""
        cfg = self.config
        if not self.replicas:
            return cfg.prefill_s_per_token, cfg.default_output_tokens * cfg.itl_s
        rate = lifetime = 0.0
        for model in self.replicas.values():
            rate += model.prefill_s_per_token
            lifetime += model.mean_output * model.itl_s
        count = len(self.replicas)
        return rate / count, lifetime / count

    # -- bookkeeping ----------------------------------------------------------------------

    def _record(self, request: RequestDescriptor, target: TargetState, uncached: int) -> None:
        model = self.book.model(target.target_id)
        previous = model.inflight.pop(request.request_id, None)
        if previous is not None:  # the same request again on the same replica (a retry)
            model.kv_tokens -= previous.kv_tokens
            model.queued_prefill -= 0 if previous.prefilled else previous.uncached
            model.decoding -= 1 if previous.prefilled else 0
            self.decoding_total -= 1 if previous.prefilled else 0
        # What its first token's TTFT will carry (reindexed below).
        model.rtt_s = rtt_s(self.config, target)
        entry = InFlight(uncached, uncached + self._decode_tokens(request), model.queued_prefill)
        if target.target_id in self.following:
            entry.blocks = request.block_hashes
        model.inflight[request.request_id] = entry
        model.queued_prefill += uncached
        model.kv_tokens += entry.kv_tokens
        self.book.reindex(target.target_id, model)
        self.mean_uncached = self._ewma(self.mean_uncached, float(uncached))
        prompt = request.prompt_tokens
        self.mean_prompt = self._ewma(self.mean_prompt, float(prompt))
        if prompt > 0:
            self.reuse = self._ewma(self.reuse, 1.0 - uncached / prompt)
        self.tree.insert(request.block_hashes, target.target_id)

    def _ewma(self, current: float, sample: float) -> float:
        return ewma(self.config.ewma_alpha, current, sample)
