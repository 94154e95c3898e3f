package appliance

import "net/http"

func (s *server) GetPrices(w http.ResponseWriter, r *http.Request) {
	result(w, http.StatusOK, s.d.agents.Prices(), nil)
}
