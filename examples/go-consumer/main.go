// Command go-consumer reads a stream_vips model topic without Python: it consumes the topic from
// the start (read_committed), reassembles chunked messages, validates each against the JSON
// Schema, keeps the latest version per model id, decodes the natural parameters and prints, for
// fixed inputs, the predictions of each model from its summary block and from its full natural
// parameters. The contract it follows is docs/model-topic.md.
//
//	go-consumer -brokers localhost:9092 -topic stream-vips-models \
//	    -schema ../../stream_vips/schemas/model-message.v1.json
//
// Output: one JSON object on stdout, {"models": {model id: report}} (see report in model.go).
package main

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/santhosh-tekuri/jsonschema/v6"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
)

// Record headers of a chunked message (connectors/kafka/sink.py).
const (
	chunkHeader     = "stream-vips-chunk"
	messageIDHeader = "stream-vips-message-id"
	sha256Header    = "stream-vips-sha256"
)

func main() {
	brokers := flag.String("brokers", "localhost:9092", "bootstrap servers, comma-separated")
	topic := flag.String("topic", "stream-vips-models", "the model topic")
	schemaPath := flag.String("schema", "model-message.v1.json", "the model message JSON Schema")
	bits := flag.Bool("bits", false, "print every decoded array element as the hex of its float64 bits")
	timeout := flag.Duration("timeout", 60*time.Second, "give up reading after this long")
	flag.Parse()

	schema, err := compileSchema(*schemaPath)
	if err != nil {
		fail("schema: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), *timeout)
	defer cancel()
	payloads, chunked, err := readTopic(ctx, strings.Split(*brokers, ","), *topic)
	if err != nil {
		fail("reading %s: %v", *topic, err)
	}
	latest := map[string]map[string]any{}
	for _, p := range payloads {
		msg, err := parseValid(schema, p)
		if err != nil {
			fmt.Fprintf(os.Stderr, "skipped an invalid model message: %v\n", err)
			continue
		}
		id := msg["model_id"].(string)
		if cur, ok := latest[id]; !ok || version(msg) >= version(cur) {
			latest[id] = msg
		}
	}
	out := map[string]any{}
	for id, msg := range latest {
		rep, err := report(msg, *bits)
		if err != nil {
			fail("model %q: %v", id, err)
		}
		rep["chunked"] = chunked[id]
		out[id] = rep
	}
	enc := json.NewEncoder(os.Stdout)
	if err := enc.Encode(map[string]any{"models": out}); err != nil {
		fail("writing: %v", err)
	}
}

func fail(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "go-consumer: "+format+"\n", args...)
	os.Exit(1)
}

func version(msg map[string]any) int64 {
	v, _ := msg["version"].(json.Number).Int64()
	return v
}

func compileSchema(path string) (*jsonschema.Schema, error) {
	c := jsonschema.NewCompiler()
	c.AssertFormat()
	return c.Compile(path)
}

// parseValid parses one whole payload, validates it against the schema and checks that a privacy
// claim is backed (docs/model-topic.md, "Private or not").
func parseValid(schema *jsonschema.Schema, payload []byte) (map[string]any, error) {
	inst, err := jsonschema.UnmarshalJSON(bytes.NewReader(payload))
	if err != nil {
		return nil, err
	}
	if err := schema.Validate(inst); err != nil {
		return nil, err
	}
	dec := json.NewDecoder(bytes.NewReader(payload))
	dec.UseNumber()
	var msg map[string]any
	if err := dec.Decode(&msg); err != nil {
		return nil, err
	}
	if sv, _ := msg["schema_version"].(json.Number).Int64(); sv != 1 {
		return nil, fmt.Errorf("schema_version %v is not 1", msg["schema_version"])
	}
	if _, err := privateClaim(msg); err != nil {
		return nil, err
	}
	return msg, nil
}

// readTopic returns every whole payload of the topic in partition order, reassembling chunks,
// and how many chunked messages each model id had.
func readTopic(ctx context.Context, brokers []string, topic string) ([][]byte, map[string]int, error) {
	cl, err := kgo.NewClient(
		kgo.SeedBrokers(brokers...),
		kgo.ConsumeTopics(topic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		kgo.FetchIsolationLevel(kgo.ReadCommitted()),
		kgo.FetchMaxBytes(64<<20),
	)
	if err != nil {
		return nil, nil, err
	}
	defer cl.Close()
	// the last stable offset of every partition: read until each is reached
	stable, err := kadm.NewClient(cl).ListCommittedOffsets(ctx, topic)
	if err != nil {
		return nil, nil, err
	}
	want := map[int32]int64{}
	stable.Each(func(o kadm.ListedOffset) {
		if o.Err == nil && o.Offset > 0 {
			want[o.Partition] = o.Offset
		}
	})
	seen := map[int32]int64{}
	parts := map[string]map[int][]byte{}
	chunked := map[string]int{}
	var out [][]byte
	for !reached(seen, want) {
		fetches := cl.PollFetches(ctx)
		if err := ctx.Err(); err != nil {
			return nil, nil, fmt.Errorf("%w before the end of the topic", err)
		}
		for _, fe := range fetches.Errors() {
			return nil, nil, fmt.Errorf("partition %d: %w", fe.Partition, fe.Err)
		}
		fetches.EachRecord(func(r *kgo.Record) {
			seen[r.Partition] = r.Offset
			whole, ok, err := reassemble(parts, r)
			if err != nil {
				fmt.Fprintf(os.Stderr, "skipped a chunked message: %v\n", err)
				return
			}
			if ok {
				out = append(out, whole)
				if len(headers(r)[chunkHeader]) > 0 {
					chunked[string(r.Key)]++
				}
			}
		})
	}
	return out, chunked, nil
}

// reached: every partition's records are read up to its last stable offset (the offset before it
// may be a transaction's commit marker, which is not delivered).
func reached(seen, want map[int32]int64) bool {
	for p, end := range want {
		off, ok := seen[p]
		if !ok || off < end-2 {
			return false
		}
	}
	return true
}

func headers(r *kgo.Record) map[string][]byte {
	h := map[string][]byte{}
	for _, x := range r.Headers {
		h[x.Key] = x.Value
	}
	return h
}

// reassemble adds one record; it returns the whole payload when a message is complete.
func reassemble(parts map[string]map[int][]byte, r *kgo.Record) ([]byte, bool, error) {
	h := headers(r)
	info, ok := h[chunkHeader]
	if !ok {
		return r.Value, r.Value != nil, nil
	}
	idx, count, found := strings.Cut(string(info), "/")
	if !found {
		return nil, false, fmt.Errorf("bad chunk header %q", info)
	}
	i, err1 := strconv.Atoi(idx)
	n, err2 := strconv.Atoi(count)
	if err1 != nil || err2 != nil || n < 1 || i < 0 || i >= n {
		return nil, false, fmt.Errorf("bad chunk header %q", info)
	}
	id := string(h[messageIDHeader])
	if parts[id] == nil {
		parts[id] = map[int][]byte{}
	}
	parts[id][i] = r.Value
	if i != n-1 {
		return nil, false, nil
	}
	pieces := parts[id]
	delete(parts, id)
	if len(pieces) != n {
		return nil, false, fmt.Errorf("%d of %d chunks missing", n-len(pieces), n)
	}
	var whole []byte
	for k := 0; k < n; k++ {
		whole = append(whole, pieces[k]...)
	}
	sum := sha256.Sum256(whole)
	if hex.EncodeToString(sum[:]) != string(h[sha256Header]) {
		return nil, false, fmt.Errorf("reassembled payload fails its sha256")
	}
	return whole, true, nil
}
