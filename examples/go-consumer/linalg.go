package main

import "math"

func dot(a, b []float64) float64 {
	s := 0.0
	for i := range a {
		s += a[i] * b[i]
	}
	return s
}

// quad is x' A x.
func quad(A [][]float64, x []float64) float64 {
	s := 0.0
	for i := range A {
		s += x[i] * dot(A[i], x)
	}
	return s
}

// square views a (d, d) array as rows.
func square(a array) [][]float64 { return a.rows() }

// cholesky returns the lower-triangular L with A = L L' (A symmetric positive definite).
func cholesky(A [][]float64) [][]float64 {
	n := len(A)
	L := make([][]float64, n)
	for i := range L {
		L[i] = make([]float64, n)
	}
	for j := 0; j < n; j++ {
		s := A[j][j]
		for k := 0; k < j; k++ {
			s -= L[j][k] * L[j][k]
		}
		if !(s > 0) {
			panic("matrix is not positive definite")
		}
		L[j][j] = math.Sqrt(s)
		for i := j + 1; i < n; i++ {
			t := A[i][j]
			for k := 0; k < j; k++ {
				t -= L[i][k] * L[j][k]
			}
			L[i][j] = t / L[j][j]
		}
	}
	return L
}

// cholSolve solves (L L') x = b.
func cholSolve(L [][]float64, b []float64) []float64 {
	n := len(L)
	y := make([]float64, n)
	for i := 0; i < n; i++ {
		s := b[i]
		for k := 0; k < i; k++ {
			s -= L[i][k] * y[k]
		}
		y[i] = s / L[i][i]
	}
	x := make([]float64, n)
	for i := n - 1; i >= 0; i-- {
		s := y[i]
		for k := i + 1; k < n; k++ {
			s -= L[k][i] * x[k]
		}
		x[i] = s / L[i][i]
	}
	return x
}

// inverse of L L', column by column.
func inverse(L [][]float64) [][]float64 {
	n := len(L)
	out := make([][]float64, n)
	for i := range out {
		out[i] = make([]float64, n)
	}
	for j := 0; j < n; j++ {
		e := make([]float64, n)
		e[j] = 1
		col := cholSolve(L, e)
		for i := 0; i < n; i++ {
			out[i][j] = col[i]
		}
	}
	return out
}
