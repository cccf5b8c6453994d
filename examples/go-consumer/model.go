package main

import (
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"math"
	"sort"
)

// array is a decoded natural parameter: its values (as float64) and shape.
type array struct {
	dtype string
	shape []int
	data  []float64
}

// decodeArray decodes {"dtype", "shape", "encoding": "base64-le", "data"} (docs/model-topic.md, Arrays).
func decodeArray(obj map[string]any) (array, error) {
	if obj["encoding"] != "base64-le" {
		return array{}, fmt.Errorf("unknown encoding %v", obj["encoding"])
	}
	raw, err := base64.StdEncoding.DecodeString(obj["data"].(string))
	if err != nil {
		return array{}, err
	}
	a := array{dtype: obj["dtype"].(string), shape: []int{}}
	n := 1
	for _, s := range obj["shape"].([]any) {
		k, _ := s.(json.Number).Int64()
		a.shape = append(a.shape, int(k))
		n *= int(k)
	}
	size := map[string]int{"float64": 8, "float32": 4, "int64": 8, "int32": 4}[a.dtype]
	if size == 0 || len(raw) != n*size {
		return array{}, fmt.Errorf("%s array of shape %v cannot hold %d bytes", a.dtype, a.shape, len(raw))
	}
	a.data = make([]float64, n)
	for i := range a.data {
		b := raw[i*size : (i+1)*size]
		switch a.dtype {
		case "float64":
			a.data[i] = math.Float64frombits(binary.LittleEndian.Uint64(b))
		case "float32":
			a.data[i] = float64(math.Float32frombits(binary.LittleEndian.Uint32(b)))
		case "int64":
			a.data[i] = float64(int64(binary.LittleEndian.Uint64(b)))
		case "int32":
			a.data[i] = float64(int32(binary.LittleEndian.Uint32(b)))
		}
		if math.IsNaN(a.data[i]) || math.IsInf(a.data[i], 0) {
			return array{}, fmt.Errorf("NaN or infinity in a natural parameter")
		}
	}
	return a, nil
}

// rows splits a (k, d) array, or the (d,) vector as one row (a scalar has none).
func (a array) rows() [][]float64 {
	if len(a.shape) == 0 {
		return nil
	}
	d := a.shape[len(a.shape)-1]
	out := [][]float64{}
	for i := 0; i+d <= len(a.data) && d > 0; i += d {
		out = append(out, a.data[i:i+d])
	}
	return out
}

// privateClaim: whether the message carries a backed privacy guarantee; an error for a claim the
// report does not back (docs/model-topic.md, "Private or not").
func privateClaim(msg map[string]any) (bool, error) {
	p := msg["privacy"].(map[string]any)
	eps, epsOK := number(p["epsilon_spent"])
	claim, hasFlag := p["private"].(bool)
	if !hasFlag {
		claim = epsOK && !math.IsInf(eps, 0)
	}
	if !claim {
		return false, nil
	}
	z, _ := number(p["noise_multiplier"])
	budget, budgetOK := number(p["epsilon_budget"])
	switch {
	case !(z > 0) || math.IsInf(z, 0):
		return false, fmt.Errorf("claims privacy without noise")
	case p["accountant"] == "none":
		return false, fmt.Errorf("claims privacy without an accountant")
	case !epsOK || !budgetOK || eps < 0 || eps > budget*(1+1e-6):
		return false, fmt.Errorf("claims privacy with epsilon %v over budget %v", p["epsilon_spent"], p["epsilon_budget"])
	}
	return true, nil
}

// number reads a JSON number (false for null or anything else).
func number(v any) (float64, bool) {
	n, ok := v.(json.Number)
	if !ok {
		return math.NaN(), false
	}
	f, err := n.Float64()
	return f, err == nil
}

func num(v any) float64 {
	f, _ := number(v)
	return f
}

func vec(v any) []float64 {
	var out []float64
	for _, x := range v.([]any) {
		out = append(out, num(x))
	}
	return out
}

func mat(v any) [][]float64 {
	var out [][]float64
	for _, row := range v.([]any) {
		out = append(out, vec(row))
	}
	return out
}

// inputs are the fixed inputs predictions are printed for: x[i][j] = 0.9 sin(1.7 (i + 1) + 0.3 (j + 1)).
func inputs(d int) [][]float64 {
	out := make([][]float64, 5)
	for i := range out {
		out[i] = make([]float64, d)
		for j := range out[i] {
			out[i][j] = 0.9 * math.Sin(1.7*float64(i+1)+0.3*float64(j+1))
		}
	}
	return out
}

// report is what the consumer prints for one model: its identity and privacy, its decoded arrays,
// and the predictions for the fixed inputs from the summary block and from the natural parameters.
func report(msg map[string]any, withBits bool) (map[string]any, error) {
	private, _ := privateClaim(msg)
	hyper := msg["hyperparameters"].(map[string]any)
	arrays := map[string]array{}
	printed := map[string]any{}
	for name, obj := range msg["natural_parameters"].(map[string]any) {
		a, err := decodeArray(obj.(map[string]any))
		if err != nil {
			return nil, fmt.Errorf("%s: %w", name, err)
		}
		arrays[name] = a
		printed[name] = arrayReport(a, withBits)
	}
	out := map[string]any{"family": msg["family"], "version": version(msg), "private": private,
		"arrays": printed}
	summary, hasSummary := msg["summary"].(map[string]any)
	if hasSummary {
		out["predictive"] = summary["predictive"]
	}
	family := msg["family"].(string)
	var fromSummary, fromFull any
	var xs [][]float64
	switch family {
	case "logistic":
		xs = inputs(arrays["h"].shape[0])
		fromFull = logisticFull(arrays, xs)
		if hasSummary {
			fromSummary = logisticSummary(summary, xs)
		}
	case "linreg":
		xs = inputs(arrays["shift"].shape[0])
		fromFull = linregFull(arrays, hyper, xs)
		if hasSummary {
			fromSummary = linregSummary(summary, xs)
		}
	case "sep_mixture":
		xs = inputs(arrays["eta"].shape[1])
		fromFull = mixtureFull(arrays, hyper, xs)
		if hasSummary {
			fromSummary = mixtureSummary(summary, xs)
		}
	case "lda":
		fromFull = map[string]any{"top_words": ldaTopWords(arrays["lambda"], hyper, 8)}
		if hasSummary {
			fromSummary = map[string]any{"top_words": summary["top_words"]}
		}
	default:
		out["note"] = "no prediction implemented here for this family; see the summary's predictive rule"
	}
	if xs != nil {
		out["inputs"] = xs
	}
	if fromFull != nil {
		out["from_full_parameters"] = fromFull
	}
	if fromSummary != nil {
		out["from_summary"] = fromSummary
	}
	return out, nil
}

// arrayReport: dtype, shape, the sha256 of the decoded float64 values' little-endian bits and,
// with -bits, every value's bits in hex.
func arrayReport(a array, withBits bool) map[string]any {
	h := sha256.New()
	buf := make([]byte, 8)
	var bits []string
	for _, v := range a.data {
		binary.LittleEndian.PutUint64(buf, math.Float64bits(v))
		h.Write(buf)
		if withBits {
			bits = append(bits, fmt.Sprintf("%016x", math.Float64bits(v)))
		}
	}
	out := map[string]any{"dtype": a.dtype, "shape": a.shape, "float64_sha256": hex.EncodeToString(h.Sum(nil))}
	if withBits {
		out["bits"] = bits
	}
	return out
}

// clip scales x down to L2 norm bound when it is longer (a null bound: no clipping).
func clip(x []float64, bound float64) []float64 {
	n := math.Sqrt(dot(x, x))
	if math.IsNaN(bound) || n <= bound {
		return x
	}
	out := make([]float64, len(x))
	for i := range x {
		out[i] = x[i] * (bound / n)
	}
	return out
}

func sigmoid(t float64) float64 { return 1 / (1 + math.Exp(-t)) }

// logisticSummary: p = sigmoid(mean . x / sqrt(1 + probit_scale x' covariance x)).
func logisticSummary(s map[string]any, xs [][]float64) map[string]any {
	mean, cov := vec(s["mean"]), mat(s["covariance"])
	c, xclip := num(s["probit_scale"]), num(s["x_clip"])
	var p []float64
	for _, x := range xs {
		x = clip(x, xclip)
		p = append(p, sigmoid(dot(mean, x)/math.Sqrt(1+c*quad(cov, x))))
	}
	return map[string]any{"p": p}
}

// logisticFull: mean = precision^-1 h, and x' precision^-1 x, by Cholesky; the input clip is 1.
func logisticFull(a map[string]array, xs [][]float64) map[string]any {
	L := cholesky(square(a["precision"]))
	mean := cholSolve(L, a["h"].data)
	var p []float64
	for _, x := range xs {
		x = clip(x, 1)
		p = append(p, sigmoid(dot(mean, x)/math.Sqrt(1+math.Pi/8*dot(x, cholSolve(L, x)))))
	}
	return map[string]any{"p": p}
}

func linregSummary(s map[string]any, xs [][]float64) map[string]any {
	mean, xclip := vec(s["mean"]), num(s["x_clip"])
	var m, v []float64
	for _, x := range xs {
		x = clip(x, xclip)
		m = append(m, dot(mean, x))
		if sm, ok := s["scale_matrix"]; ok { // Gamma noise: Student-t with 2a degrees of freedom
			a, b := num(s["noise_shape"]), num(s["noise_rate"])
			v = append(v, b/a*(1+quad(mat(sm), x))*(2*a)/(2*a-2))
		} else {
			v = append(v, num(s["noise_variance"])+quad(mat(s["covariance"]), x))
		}
	}
	return map[string]any{"mean": m, "variance": v}
}

func linregFull(a map[string]array, hyper map[string]any, xs [][]float64) map[string]any {
	L := cholesky(square(a["precision"]))
	shift := a["shift"].data
	mean := cholSolve(L, shift)
	gamma := hyper["noise"] == "gamma"
	var shape, rate float64
	if gamma {
		shape = a["shape"].data[0]
		rate = 0.5 * (a["quadratic"].data[0] - dot(shift, mean))
	}
	var m, v []float64
	for _, x := range xs {
		x = clip(x, num(hyper["x_bound"]))
		m = append(m, dot(mean, x))
		q := dot(x, cholSolve(L, x))
		if gamma {
			v = append(v, rate/shape*(1+q)*(2*shape)/(2*shape-2))
		} else {
			v = append(v, 1/num(hyper["noise_precision"])+q)
		}
	}
	return map[string]any{"mean": m, "variance": v}
}

// responsibilities: p(j | x) proportional to w_j N(x; m_j, C_j + diag(v_j)), v_j the component's
// diagonal spreads.
func responsibilities(w []float64, means [][]float64, covs [][][]float64, spreads [][]float64, xs [][]float64) map[string]any {
	var resp [][]float64
	var best []int
	for _, x := range xs {
		logp := make([]float64, len(w))
		for j := range w {
			S := make([][]float64, len(x))
			for r := range S {
				S[r] = append([]float64(nil), covs[j][r]...)
				S[r][r] += spreads[j][r]
			}
			L := cholesky(S)
			diff := make([]float64, len(x))
			for i := range x {
				diff[i] = x[i] - means[j][i]
			}
			logdet := 0.0
			for i := range L {
				logdet += 2 * math.Log(L[i][i])
			}
			logp[j] = math.Log(w[j]) - 0.5*(dot(diff, cholSolve(L, diff))+logdet+float64(len(x))*math.Log(2*math.Pi))
		}
		top := 0
		for j := range logp {
			if logp[j] > logp[top] {
				top = j
			}
		}
		total := 0.0
		r := make([]float64, len(w))
		for j := range logp {
			r[j] = math.Exp(logp[j] - logp[top])
			total += r[j]
		}
		for j := range r {
			r[j] /= total
		}
		resp = append(resp, r)
		best = append(best, top)
	}
	return map[string]any{"responsibilities": resp, "component": best}
}

// uniformSpreads: K x d spreads all noise_sd^2 (a message from before spreads were learnt).
func uniformSpreads(K, d int, noiseSD float64) [][]float64 {
	v := make([][]float64, K)
	for j := range v {
		v[j] = make([]float64, d)
		for i := range v[j] {
			v[j][i] = noiseSD * noiseSD
		}
	}
	return v
}

func mixtureSummary(s map[string]any, xs [][]float64) map[string]any {
	var covs [][][]float64
	for _, c := range s["covariances"].([]any) {
		covs = append(covs, mat(c))
	}
	means := mat(s["means"])
	spreads := uniformSpreads(len(means), len(means[0]), num(s["noise_sd"]))
	if v, ok := s["variances"]; ok {
		spreads = mat(v)
	}
	return responsibilities(vec(s["weights"]), means, covs, spreads, xs)
}

// noiseShrink: the model's NOISE_SHRINK, the pseudo-records per unit of public noise on the
// averaged statistics (docs/model-topic.md, sep_mixture).
const noiseShrink = 0.5

// mixtureWeightsSpreads: the weights and diagonal spreads from the averaged statistics count (K),
// square (K x d) and their public noise stds stat_noise (2), as docs/model-topic.md gives them:
// nu_n = max(prior_count, 0.5 N stat_noise[0]), nu_q = max(prior_count, 0.5 N stat_noise[1] / noise_sd^2),
// w_j proportional to N max(count_j, 0) + nu_n, v_ji = (N max(square_ji, 0) + nu_q noise_sd^2) /
// (N max(count_j, 0) + nu_q) clipped to [min(sd_floor, spread_bound)^2, spread_bound^2].
func mixtureWeightsSpreads(a map[string]array, hyper map[string]any, K, d int) ([]float64, [][]float64) {
	noiseSD := num(hyper["noise_sd"])
	w := make([]float64, K)
	count, ok := a["count"]
	if !ok { // before spreads were learnt, or learn_spreads: false
		for j := range w {
			w[j] = 1 / float64(K)
		}
		return w, uniformSpreads(K, d, noiseSD)
	}
	N, prior := num(hyper["dataset_size"]), num(hyper["prior_count"])
	noise := a["stat_noise"].data
	nuN := math.Max(prior, noiseShrink*N*noise[0])
	nuQ := math.Max(prior, noiseShrink*N*noise[1]/(noiseSD*noiseSD))
	lo := math.Pow(math.Min(num(hyper["sd_floor"]), num(hyper["spread_bound"])), 2)
	hi := math.Pow(num(hyper["spread_bound"]), 2)
	total := 0.0
	v := make([][]float64, K)
	for j := 0; j < K; j++ {
		n := N * math.Max(count.data[j], 0)
		w[j] = n + nuN
		total += w[j]
		v[j] = make([]float64, d)
		for i := 0; i < d; i++ {
			q := (N*math.Max(a["square"].data[j*d+i], 0) + nuQ*noiseSD*noiseSD) / (n + nuQ)
			v[j][i] = math.Min(math.Max(q, lo), hi)
		}
	}
	for j := range w {
		w[j] /= total
	}
	return w, v
}

// mixtureFull: covariance_j = prec_j^-1, mean_j = covariance_j eta_j; weights and spreads from the
// averaged statistics.
func mixtureFull(a map[string]array, hyper map[string]any, xs [][]float64) map[string]any {
	etas := a["eta"].rows()
	K, d := len(etas), len(etas[0])
	var means [][]float64
	var covs [][][]float64
	for j := 0; j < K; j++ {
		P := make([][]float64, d)
		for r := 0; r < d; r++ {
			P[r] = a["prec"].data[(j*d+r)*d : (j*d+r+1)*d]
		}
		L := cholesky(P)
		means = append(means, cholSolve(L, etas[j]))
		covs = append(covs, inverse(L))
	}
	w, spreads := mixtureWeightsSpreads(a, hyper, K, d)
	return responsibilities(w, means, covs, spreads, xs)
}

// ldaTopWords: each topic's n most probable words (lambda normalised per row; ties by index).
func ldaTopWords(lam array, hyper map[string]any, n int) [][]string {
	vocab := hyper["vocabulary"].([]any)
	var out [][]string
	for _, row := range lam.rows() {
		idx := make([]int, len(row))
		for i := range idx {
			idx[i] = i
		}
		sort.SliceStable(idx, func(p, q int) bool { return row[idx[p]] > row[idx[q]] })
		var words []string
		for _, i := range idx[:n] {
			words = append(words, vocab[i].(string))
		}
		out = append(out, words)
	}
	return out
}
