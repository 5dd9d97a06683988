package handler

import (
	"encoding/json"
	"net/http"
	"testing"
)

// TestAnswerBodies checks the precomputed answer bodies: every outcome has
// one for each class of status, each is the JSON the endpoint documents,
// and an outcome outside the table is still encoded.
func TestAnswerBodies(t *testing.T) {
	if got, want := len(answerBodies), 2*len(messages)+2*7; got != want {
		// messages covers the outcomes answered with errors; seven more are
		// answered 2xx only (processed, queued … ping).
		t.Errorf("answerBodies holds %d bodies, want %d", got, want)
	}
	for k, b := range answerBodies {
		checkAnswerBody(t, k, b)
	}
	k := bodyKey{ok: false, outcome: "not_an_outcome"}
	checkAnswerBody(t, k, answerBody(http.StatusInternalServerError, k.outcome))
	if got := answerBody(http.StatusOK, AnswerProcessed); string(got) != "{\"status\":\"processed\"}\n" {
		t.Errorf("processed body = %q", got)
	}
	if got := answerBody(http.StatusConflict, AnswerInFlight); string(got) != "{\"error\":\"in_flight\",\"message\":\"event is being processed; retry later\"}\n" {
		t.Errorf("in-flight body = %q", got)
	}
}

func checkAnswerBody(t *testing.T, k bodyKey, b []byte) {
	t.Helper()
	if len(b) == 0 || b[len(b)-1] != '\n' {
		t.Errorf("%+v: body %q does not end in a newline", k, b)
		return
	}
	var v map[string]string
	if err := json.Unmarshal(b, &v); err != nil {
		t.Errorf("%+v: body %q: %v", k, b, err)
		return
	}
	if k.ok {
		if len(v) != 1 || v["status"] != string(k.outcome) {
			t.Errorf("%+v: body %q, want only status %q", k, b, k.outcome)
		}
		return
	}
	if len(v) != 2 || v["error"] != string(k.outcome) || v["message"] != messages[k.outcome] {
		t.Errorf("%+v: body %q, want error %q and message %q", k, b, k.outcome, messages[k.outcome])
	}
}
